//! The status page on the admin port: `GET /` (the HTML), `GET /page.js` and
//! `GET /page.css`, all three compiled into the binary (`page/`), so the page needs nothing
//! from outside and works offline.
//!
//! The script and the style are files of their own, not inline, so that every answer can
//! carry a strict `Content-Security-Policy` ([`CSP`]): scripts and styles only from this
//! origin, requests only to it, no frames, no forms posting elsewhere. A value a page shows
//! (a rule's name, an explanation's entries) is set as text by the script, never as HTML.
//!
//! The page polls `/status.json` (`status.rs`) and, only when that says `/top` would answer
//! (open reads, or a token the user typed, kept in the tab's `sessionStorage`), `/top`. Its
//! explain form posts to `/explain`.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The policy every page answer carries: this origin's script, style and requests only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; \
     base-uri 'none'";

const HTML: &str = include_str!("page/index.html");
const JS: &str = include_str!("page/page.js");
const CSS: &str = include_str!("page/page.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Small and compiled in: a reload of the page fetches them again, so a new
            // version is seen at once after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn index() -> Response {
    asset("text/html; charset=utf-8", HTML)
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_nothing_inline() {
        for (name, text) in [("index.html", HTML), ("page.js", JS), ("page.css", CSS)] {
            for outside in ["http://", "https://", "//fonts", "@import"] {
                assert!(!text.contains(outside), "{name} names {outside}");
            }
        }
        // Inline script or style would be refused by the policy: only the files' own tags.
        assert_eq!(HTML.matches("<script").count(), 1);
        assert!(HTML.contains(r#"<script src="/page.js" defer></script>"#));
        assert!(!HTML.contains("<style"));
        assert!(!HTML.contains(" style="));
        assert!(
            !HTML
                .split_whitespace()
                .any(|w| w.starts_with("on") && w.contains('=')),
            "no inline event handlers"
        );
        // Values reach the DOM as text only.
        assert!(!JS.contains("innerHTML"));
    }
}
