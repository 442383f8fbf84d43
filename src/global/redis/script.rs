//! Lua scripts on Redis, and the one place `NOSCRIPT` is handled. A call names its script by
//! hash (`EVALSHA`); a server that does not hold it (new, restarted or flushed, or a cluster
//! node that never ran it) answers `NOSCRIPT` without running anything, and the call goes
//! again with the source (`EVAL`), which runs it and caches it there. The sync's scripts
//! (`sync.rs`) and the exact rules' (`global/redis/exact.rs`) all go through [`Call`].

use deadpool_redis::redis::{self, aio::ConnectionLike, Cmd, RedisError, Value};

/// A script and its hash, computed once.
pub(crate) struct Lua {
    script: redis::Script,
    source: &'static str,
}

impl Lua {
    /// The script `source` (an `include_str!` of its `.lua` file).
    pub(crate) fn new(source: &'static str) -> Self {
        Lua {
            script: redis::Script::new(source),
            source,
        }
    }
}

/// The arguments of a script call after the script: the key count, the keys, the arguments.
type Args<'a> = Box<dyn Fn(&mut Cmd) + Send + Sync + 'a>;

/// One call of a script.
pub(crate) struct Call<'a> {
    lua: &'a Lua,
    args: Args<'a>,
}

impl<'a> Call<'a> {
    /// A call of `lua` whose key count, keys and arguments `args` appends.
    pub(crate) fn new(lua: &'a Lua, args: impl Fn(&mut Cmd) + Send + Sync + 'a) -> Self {
        Call {
            lua,
            args: Box::new(args),
        }
    }

    /// The command: `EVALSHA <hash> …`, or with `by_source`, `EVAL <source> …`.
    pub(crate) fn cmd(&self, by_source: bool) -> Cmd {
        let mut cmd = if by_source {
            let mut c = redis::cmd("EVAL");
            c.arg(self.lua.source);
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.lua.script.get_hash());
            c
        };
        (self.args)(&mut cmd);
        cmd
    }

    /// Runs the call alone, with its source when the server does not hold the script.
    ///
    /// # Errors
    /// The call's error (an error reply included).
    pub(crate) async fn run<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<Value, RedisError> {
        match self.cmd(false).query_async(conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => self.cmd(true).query_async(conn).await,
            r => r,
        }
    }
}

/// Runs `calls` in one pipeline, each reply read on its own (an error reply is a
/// [`Value::ServerError`] in its place, so one call's failure never hides what the others
/// applied); the calls answered `NOSCRIPT`, which ran nothing, go again with their source in
/// a second pipeline.
///
/// # Errors
/// When the pipeline itself fails (the connection, say).
pub(crate) async fn pipeline<C: ConnectionLike + Send>(
    conn: &mut C,
    calls: &[Call<'_>],
) -> Result<Vec<Value>, RedisError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for c in calls {
        pipe.add_command(c.cmd(false));
    }
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    let redo: Vec<usize> = (0..replies.len())
        .filter(|&i| is_noscript(&replies[i]))
        .collect();
    if redo.is_empty() {
        return Ok(replies);
    }
    let mut again = redis::pipe();
    again.ignore_errors();
    for &i in &redo {
        again.add_command(calls[i].cmd(true));
    }
    let second: Vec<Value> = again.query_async(conn).await?;
    for (i, v) in redo.into_iter().zip(second) {
        replies[i] = v;
    }
    Ok(replies)
}

/// Whether a pipeline's reply says the server does not hold the script.
fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}
