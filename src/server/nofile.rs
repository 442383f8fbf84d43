//! The process's open-files limit: raised at start from the soft limit to the hard one, as
//! Go services do, so that gRPC clients, Redis connections and the admin port are bounded by
//! what the operator allowed (the hard limit) rather than by a login default of 1024.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs both values. A failure is a
/// warning: the service still runs, within the limit it was given.
pub fn raise_open_files_limit() {
    let before = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-files limit; leaving it as is");
            return;
        }
    };
    // `increase_nofile_limit` clamps to the hard limit (and to the kernel's own cap where
    // the hard limit is "unlimited"), and returns the soft limit in force afterwards.
    match rlimit::increase_nofile_limit(rlimit::INFINITY) {
        Ok(soft) if soft == before.0 => {
            tracing::info!(
                soft,
                hard = before.1,
                "open-files limit already at its most"
            )
        }
        Ok(soft) => tracing::info!(
            old_soft = before.0,
            hard = before.1,
            new_soft = soft,
            "open-files limit raised to the hard limit"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            soft = before.0,
            hard = before.1,
            "cannot raise the open-files limit; running with the soft limit"
        ),
    }
}

/// `wanted` connections, or fewer if the open-files soft limit leaves less than `reserve`
/// descriptors beside them: at the limit a new connection, a rules file read or a Redis
/// reconnection would fail, so the cap must bind first. Logs a warning when it lowers it.
pub fn fit_connections(wanted: usize, reserve: usize) -> usize {
    let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) else {
        return wanted;
    };
    let room = usize::try_from(soft)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve)
        .max(1);
    if room < wanted {
        tracing::warn!(
            wanted,
            open_files_limit = soft,
            cap = room,
            "gRPC connection cap lowered to fit the open-files limit"
        );
    }
    wanted.min(room)
}
