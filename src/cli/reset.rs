//! `sluice reset`: one `POST /reset` to the admin port with the admin token (`admin.rs`),
//! printing what was cleared.

use std::process::ExitCode;

use super::admin::AdminCallError;
use super::args::ResetArgs;
use super::QueryError;

/// Why `sluice reset` could not make its call.
#[derive(Debug, thiserror::Error)]
pub enum ResetCliError {
    /// A descriptor is malformed.
    #[error(transparent)]
    Descriptor(#[from] QueryError),
    /// No token given.
    #[error("no admin token: give --token-file or set SLUICE_ADMIN_TOKEN")]
    NoToken,
    /// The token file cannot be read or is empty.
    #[error("{0}")]
    Token(#[from] crate::server::admin_token::TokenError),
    /// The call failed.
    #[error(transparent)]
    Call(#[from] AdminCallError),
}

/// The token from `--token-file`, `--token` or `SLUICE_ADMIN_TOKEN`, trimmed.
fn token(args: &ResetArgs) -> Result<String, ResetCliError> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path).map_err(|source| {
            crate::server::admin_token::TokenError::Read {
                path: path.display().to_string(),
                source,
            }
        })?;
        let t = text.trim();
        if t.is_empty() {
            return Err(
                crate::server::admin_token::TokenError::Empty(path.display().to_string()).into(),
            );
        }
        return Ok(t.to_string());
    }
    args.token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or(ResetCliError::NoToken)
}

/// Sends the call; the status and the body.
async fn call(args: &ResetArgs) -> Result<(u16, String), ResetCliError> {
    let token = token(args)?;
    let body = args.request.body(None)?;
    Ok(args.request.post("/reset", &body, Some(&token)).await?)
}

/// `sluice reset`: prints what was cleared (pretty JSON); exit 1 when refused or failed.
pub async fn reset(args: &ResetArgs) -> ExitCode {
    match call(args).await {
        Ok((200, body)) => {
            let shown = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or(body);
            println!("{shown}");
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            eprintln!("sluice reset: {status}: {}", body.trim_end());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sluice reset: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_trimmed_and_required() {
        let a = ResetArgs {
            request: crate::cli::admin::AdminRequestArgs {
                addr: "http://127.0.0.1:8080".into(),
                domain: "d".into(),
                descriptors: vec!["k=a".into()],
            },
            token_file: None,
            token: Some(" t\n".into()),
        };
        assert_eq!(token(&a).unwrap(), "t");
        assert!(matches!(
            token(&ResetArgs { token: None, ..a }),
            Err(ResetCliError::NoToken)
        ));
    }
}
