//! Rules files as envoyproxy/ratelimit reads them, through `sluice check`: what the
//! reference loads passes, with a warning for each thing it ignores; the slips it refuses
//! are named with their likely cause.

use crate::process::sluice;

#[test]
fn check_passes_what_the_reference_loads_and_warns_of_what_it_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("r.yaml");
    std::fs::write(&f, "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      shadow_mode: true\n---\ndomain: e\n").unwrap();
    let out = sluice().arg("check").arg(&f).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let f = f.display();
    assert_eq!(
        text,
        format!(
            "warning: {f}: misplaced key 'shadow_mode' is ignored, as envoyproxy/ratelimit ignores it: it belongs in the descriptor, beside 'rate_limit', one level further out (line 7, column 7; domain 'd', descriptor path 'k')\n\
             warning: {f}: only the first YAML document of a file is read, as envoyproxy/ratelimit reads it: this document is ignored; put each domain in a file of its own (line 9, column 1)\n\
             OK: 1 rule(s) in 1 file(s)\n"
        )
    );
    // Slips the reference refuses too: named with their likely cause, exit 1.
    let g = dir.path().join("s.yaml");
    std::fs::write(&g, "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {unit: second, requests_per_unit: 1}\n").unwrap();
    let h = dir.path().join("t.yaml");
    std::fs::write(&h, "domain: e\ndescriptors:\n\t- key: k\n").unwrap();
    let out = sluice().arg("check").arg(&g).arg(&h).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        format!("{}: config error, unknown key 'rate_limt'; did you mean 'rate_limit'? (line 4, column 5; domain 'd', descriptor path 'k')", g.display()),
        format!("{}: error loading config file: found character that cannot start any token at line 3 column 1, while scanning for the next token; hint: YAML does not allow tabs for indentation; use spaces", h.display()),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}
