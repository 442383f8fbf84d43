//! `POST /reset` on one server in local mode: refused (401, `WWW-Authenticate: Bearer`)
//! without a token configured and with a wrong one; with the right one, the key's counters
//! are cleared (admitted again at once) and the answer says what was cleared; a bad body
//! is a 400, one past 2 MiB a 413.

use crate::common::{header, http, Server};
use sluice::server::admin_token::AdminToken;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
const BODY: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"a"}]}]}"#;

/// `POST path` with `BODY` and the `Authorization` header `auth` (none when empty), off the
/// runtime's threads.
async fn post(
    s: &Server,
    path: &'static str,
    auth: &'static str,
) -> (u16, Vec<(String, String)>, String) {
    let addr = s.http;
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = if auth.is_empty() {
            Vec::new()
        } else {
            vec![("Authorization", auth)]
        };
        http(addr, "POST", path, BODY, &headers).unwrap()
    })
    .await
    .unwrap()
}

async fn code(s: &Server) -> u16 {
    post(s, "/json", "").await.0
}

#[tokio::test]
async fn reset_is_refused_without_a_token_configured() {
    let s = Server::start(RULES, |_| {}).await;
    for auth in ["", "Bearer anything"] {
        let (status, headers, text) = post(&s, "/reset", auth).await;
        assert_eq!(status, 401, "{text}");
        assert!(
            header(&headers, "www-authenticate").is_some_and(|v| v.starts_with("Bearer")),
            "{headers:?}"
        );
        assert!(text.contains("ADMIN_TOKEN_FILE"), "{text}");
    }
}

#[tokio::test]
async fn reset_with_the_right_token_clears_the_key_and_says_what_it_cleared() {
    let s = Server::start(RULES, |st| st.admin_token = AdminToken::new("s3cret")).await;
    assert_eq!(
        [code(&s).await, code(&s).await, code(&s).await],
        [200, 200, 429]
    );
    for auth in ["", "Bearer s3cre", "Bearer s3cret-and-more", "Basic s3cret"] {
        let (status, headers, text) = post(&s, "/reset", auth).await;
        assert_eq!(status, 401, "{auth}: {text}");
        assert!(
            header(&headers, "www-authenticate").is_some(),
            "{headers:?}"
        );
        // Refused: nothing was cleared.
        assert_eq!(code(&s).await, 429);
    }
    let (status, _, text) = post(&s, "/reset", "Bearer s3cret").await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["domain"], "d");
    let d = &v["descriptors"][0];
    assert_eq!(d["rule"], "d.k");
    assert_eq!(d["exact"], false);
    assert_eq!(d["limits"][0]["requests_per_unit"], 2);
    assert_eq!(d["limits"][0]["unit"], "HOUR");
    // Seven hits were counted (the denied ones too: strict), all cleared.
    assert_eq!(d["limits"][0]["count_before"], 7, "{text}");
    assert_eq!(
        [code(&s).await, code(&s).await, code(&s).await],
        [200, 200, 429]
    );
    // Case-insensitive scheme, as RFC 9110 has it.
    assert_eq!(post(&s, "/reset", "bearer s3cret").await.0, 200);
    let addr = s.http;
    let bad = tokio::task::spawn_blocking(move || {
        http(
            addr,
            "POST",
            "/reset",
            "{not json",
            &[("Authorization", "Bearer s3cret")],
        )
        .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(bad.0, 400, "{}", bad.2);
    // Bounded as `/json` is: 2 MiB.
    let big = tokio::task::spawn_blocking(move || {
        let body = format!("{}{}", BODY, " ".repeat(2 * 1024 * 1024));
        http(
            addr,
            "POST",
            "/reset",
            &body,
            &[("Authorization", "Bearer s3cret")],
        )
        .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(big.0, 413, "{}", big.2);
}
