//! The status page (`GET /` on the admin port) in a real headless Chromium against a
//! `sluice serve` child on the example rules: it renders the rules in force, reports no
//! console error (its strict Content-Security-Policy included: a refused inline script or
//! style would be one), never asks `/top` without a token and asks it with the one typed in
//! (the key the test used through `/json` is listed with its bar), its explain form answers,
//! and it shows reloaded rules without a reload of its own.
//! Screenshots are saved to `target/test-artifacts/` (`status-page.png`, of which
//! `docs/status-page.png` is a copy, and `status-page-top-keys.png`).

use std::net::SocketAddr;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::cdp::{Chromium, Page};
use crate::common::{header, http, repo, wait_until};
use crate::process::{serve_ready, Serving};

/// `sluice serve` on the example rules (named as a user in the repository would name them,
/// for the screenshot), with `env` added.
fn serve(env: &[(&str, &str)]) -> (Serving, SocketAddr) {
    let (server, _, addr) = serve_ready(|c| {
        c.current_dir(repo())
            .env("SLUICE_CONFIG", "config/rules")
            .envs(env.iter().copied());
    });
    (server, addr)
}

#[test]
fn the_page_and_its_assets_carry_a_strict_policy_and_status_json_says_top_is_off() {
    let (_server, addr) = serve(&[]);
    for (path, kind) in [
        ("/", "text/html"),
        ("/page.js", "text/javascript"),
        ("/page.css", "text/css"),
    ] {
        let (code, headers, body) = http(addr, "GET", path, "", &[]).unwrap();
        assert_eq!(code, 200, "{path}");
        assert!(!body.is_empty(), "{path}");
        assert!(
            header(&headers, "content-type").is_some_and(|t| t.starts_with(kind)),
            "{path}: {headers:?}"
        );
        let csp = header(&headers, "content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
    }
    let (code, _, body) = http(addr, "GET", "/status.json", "", &[]).unwrap();
    assert_eq!(code, 200);
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["commit"], sluice::COMMIT);
    assert_eq!(s["mode"], "local");
    assert_eq!(s["top"], "off", "no ADMIN_TOKEN_FILE: /top is refused");
    assert_eq!(s["reload"]["ok"], true);
    assert_eq!(s["rlqs"]["streams"], 0);
    let login = s["rules"]["listed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "login")
        .unwrap_or_else(|| panic!("the example's `login` rule is listed: {body}"));
    assert_eq!(login["domain"], "edge");
    assert!(
        login["source"]
            .as_str()
            .unwrap()
            .starts_with("config/rules/example.yaml:"),
        "{login}"
    );
    assert_eq!(login["limits"][0]["algorithm"], "fixed_window");
}

/// Where the test's screenshot and Chromium's log go.
fn artifacts() -> std::path::PathBuf {
    let dir = repo().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Chromium (with its profile, removed after it) showing the page at `addr`, once the
/// rules table lists the example's named rule (rendered from /status.json).
fn open(addr: SocketAddr, log: &str) -> (Chromium, Page, tempfile::TempDir) {
    open_showing(addr, log, "login")
}

/// [`open`], waiting for the rules table to show `rule` (a rules file's name for it too).
fn open_showing(addr: SocketAddr, log: &str, rule: &str) -> (Chromium, Page, tempfile::TempDir) {
    let profile = tempfile::tempdir().unwrap();
    let chromium = Chromium::start(profile.path(), &artifacts().join(log));
    let mut page = chromium.page();
    page.call("Runtime.enable", json!({}));
    page.call("Log.enable", json!({}));
    page.call("Page.enable", json!({}));
    page.call("Network.enable", json!({}));
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": false}),
    );
    page.call("Page.navigate", json!({"url": format!("http://{addr}/")}));
    wait_until(30, &format!("the rules table to list `{rule}`"), || {
        page.eval("document.querySelector('#rules tbody')?.textContent ?? ''")
            .as_str()
            .is_some_and(|t| t.contains(rule) && t.contains(".yaml:"))
    });
    (chromium, page, profile)
}

/// Whether the element `id` is displayed.
fn shown(page: &mut Page, id: &str) -> bool {
    page.eval(&format!(
        "getComputedStyle(document.getElementById('{id}')).display !== 'none'"
    )) == json!(true)
}

/// The URLs the page requested.
fn requested(page: &Page) -> Vec<String> {
    page.events
        .iter()
        .filter(|e| e["method"] == "Network.requestWillBeSent")
        .filter_map(|e| e["params"]["request"]["url"].as_str().map(String::from))
        .collect()
}

/// Saves the whole page as a PNG in the artifacts directory.
fn screenshot(page: &mut Page, name: &str) {
    let shot = page.call(
        "Page.captureScreenshot",
        json!({"format": "png", "captureBeyondViewport": true}),
    );
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let path = artifacts().join(name);
    std::fs::write(&path, &png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

#[test]
fn chromium_renders_the_page_without_errors_and_its_explain_form_answers() {
    let (_server, addr) = serve(&[]);
    let (_chromium, mut page, _profile) = open(addr, "chromium-stderr.log");
    let header = page.eval("document.querySelector('header').textContent");
    assert!(
        header.as_str().unwrap().contains(env!("CARGO_PKG_VERSION")),
        "{header}"
    );
    let top = page.eval("document.getElementById('top-note').textContent");
    assert!(
        top.as_str().unwrap().contains("none is configured"),
        "{top}"
    );
    assert!(!shown(&mut page, "token-form"), "no token to ask for");

    // The explain form: fill it and submit it as a user would.
    page.eval(
        "document.getElementById('explain-domain').value = 'edge';\
         document.getElementById('explain-entries').value = 'path=/login, method=POST';\
         document.getElementById('explain-submit').click(); true",
    );
    wait_until(30, "the explain form's answer", || {
        !page
            .eval("document.getElementById('explain-result')?.textContent ?? ''")
            .as_str()
            .unwrap_or_default()
            .is_empty()
    });
    let answer = page.eval("document.getElementById('explain-result').textContent");
    let answer = answer.as_str().unwrap();
    assert!(answer.contains("Would be answered OK"), "{answer}");
    assert!(answer.contains("Rule login"), "{answer}");
    assert!(answer.contains("5 / minute (fixed window)"), "{answer}");

    // No request of the page went to /top (no token), nor anywhere but this server.
    let urls = requested(&page);
    assert!(urls.iter().any(|u| u.ends_with("/explain")), "{urls:?}");
    for u in &urls {
        assert!(u.starts_with(&format!("http://{addr}/")), "{u}");
        assert!(!u.contains("/top"), "{u}");
    }

    screenshot(&mut page, "status-page.png");

    // Last: errors logged while the page ran, the explain call and a poll included.
    page.eval("new Promise((done) => setTimeout(() => done(true), 100))");
    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
}

#[test]
fn with_a_token_configured_the_page_asks_for_it_then_shows_top_keys_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let (_server, addr) = serve(&[("ADMIN_TOKEN_FILE", token.to_str().unwrap())]);
    let (code, _, body) = http(addr, "GET", "/status.json", "", &[]).unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["top"],
        "token"
    );
    let (_chromium, mut page, _profile) = open(addr, "chromium-stderr-token.log");
    let note = page.eval("document.getElementById('top-note').textContent");
    assert!(
        note.as_str()
            .unwrap()
            .contains("Enter the admin token to see top keys"),
        "{note}"
    );
    assert!(shown(&mut page, "token-form"));
    assert!(!shown(&mut page, "forget-token"));
    // Nothing in the tab's storage, and nothing asked of /top without it.
    assert_eq!(
        page.eval("sessionStorage.getItem('sluice.adminToken')"),
        Value::Null
    );
    let urls = requested(&page);
    assert!(urls.iter().all(|u| !u.contains("/top")), "{urls:?}");

    // Three of the login rule's five a minute used, through /json.
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/login"},{"key":"method","value":"POST"}]}]}"#;
    for _ in 0..3 {
        let (code, _, answer) = http(addr, "POST", "/json", body, &[]).unwrap();
        assert_eq!(code, 200, "{answer}");
    }
    // The token typed in: the page asks the real /top with it, and shows the key with its bar.
    page.eval(
        "document.getElementById('token').value = 's3cret';\
         document.querySelector('#token-form button').click(); true",
    );
    wait_until(30, "the top keys table", || {
        page.eval("document.querySelector('#top tbody').textContent")
            .as_str()
            .is_some_and(|t| t.contains("method=POST"))
    });
    let row = page.eval("document.querySelector('#top tbody tr').textContent");
    assert!(row.as_str().unwrap().contains("3 / 5 a minute"), "{row}");
    assert_eq!(
        page.eval("document.querySelector('#top meter').value"),
        json!(0.6)
    );
    let urls = requested(&page);
    assert!(urls.iter().any(|u| u.ends_with("/top?n=20")), "{urls:?}");
    assert_eq!(
        page.eval("sessionStorage.getItem('sluice.adminToken')"),
        json!("s3cret")
    );
    assert!(!shown(&mut page, "token-form"));
    screenshot(&mut page, "status-page-top-keys.png");
    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");

    // Forgotten: out of the tab's storage, and the form is back.
    page.eval("document.getElementById('forget-token').click(); true");
    assert_eq!(
        page.eval("sessionStorage.getItem('sluice.adminToken')"),
        Value::Null
    );
    assert!(shown(&mut page, "token-form"));
}

#[test]
fn the_page_refreshes_itself_when_the_rules_change() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("r.yaml");
    let rule = |name: &str| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 5, name: {name}}}\n")
    };
    std::fs::write(&rules, rule("before_reload")).unwrap();
    let (_server, addr) = serve(&[("SLUICE_CONFIG", dir.path().to_str().unwrap())]);
    let (_chromium, mut page, _profile) =
        open_showing(addr, "chromium-stderr-refresh.log", "before_reload");
    // A mark in the page's window: a full reload would drop it.
    page.eval("window.sluiceTestMark = 1; true");
    std::fs::write(&rules, rule("after_reload")).unwrap();
    wait_until(30, "the page to show the reloaded rule", || {
        page.eval("document.querySelector('#rules tbody').textContent")
            .as_str()
            .is_some_and(|t| t.contains("after_reload"))
    });
    assert_eq!(page.eval("window.sluiceTestMark"), json!(1), "not reloaded");
    let reload = page.eval("document.getElementById('reload').textContent");
    assert!(
        reload.as_str().unwrap().contains("2 load(s) since start"),
        "{reload}"
    );
    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
}
