//! `sluice explain`: sends a request to the HTTP port's `POST /explain` (`admin.rs`) and
//! prints what it would be answered, and why, for a person (`--json`: the answer as the
//! server sent it).

use std::process::ExitCode;

use serde_json::{json, Value};

use super::admin::AdminCallError;
use super::{ExplainArgs, QueryError};

/// Why `sluice explain` got no explanation.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// A descriptor that is not `key=value[,...]`.
    #[error(transparent)]
    Descriptor(#[from] QueryError),
    /// The call failed.
    #[error(transparent)]
    Call(#[from] AdminCallError),
    /// The server answered with an error status.
    #[error("the server answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Its text.
        body: String,
    },
    /// The answer is not what `/explain` sends.
    #[error("unexpected answer: {0}")]
    Answer(String),
}

/// `sluice explain`: prints the explanation, or why there is none (exit 64 for a malformed
/// descriptor, 1 otherwise).
pub async fn explain(args: ExplainArgs) -> ExitCode {
    match fetch(&args).await {
        Ok(v) if args.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", render(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice explain: {e}");
            if matches!(e, ExplainError::Descriptor(_)) {
                ExitCode::from(64)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Posts the request to `/explain` and returns the answer's JSON.
async fn fetch(args: &ExplainArgs) -> Result<Value, ExplainError> {
    let mut body = args.request.body(args.hits)?;
    body["hitsAddend"] = json!(args.hits_addend);
    let (status, body) = args.request.post("/explain", &body, None).await?;
    if status != 200 {
        return Err(ExplainError::Status {
            status,
            body: body.trim_end().to_string(),
        });
    }
    serde_json::from_str(&body).map_err(|e| ExplainError::Answer(e.to_string()))
}

/// The explanation for a person.
pub fn render(v: &Value) -> String {
    use std::fmt::Write as _;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = String::new();
    let _ = write!(
        out,
        "domain {}: overall {} (nothing was counted)",
        s(&v["domain"]),
        s(&v["overall_code"])
    );
    if v["shadow_mode"].as_bool() == Some(true) {
        out.push_str("; SHADOW_MODE is on: an overall OVER_LIMIT is answered OK");
    }
    out.push('\n');
    let empty = Vec::new();
    for (i, d) in v["descriptors"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        let entries: Vec<String> = d["entries"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(|e| format!("{}={}", s(&e["key"]), s(&e["value"])))
            .collect();
        let _ = write!(
            out,
            "\ndescriptor {}: {} ({} hit(s)",
            i + 1,
            entries.join(", "),
            d["hits"]
        );
        if d["refund"].as_bool() == Some(true) {
            out.push_str(", given back");
        }
        out.push_str(")\n");
        if let Some(m) = d.get("no_match") {
            let _ = writeln!(out, "  no rule: {}", s(&m["message"]));
            continue;
        }
        let r = &d["rule"];
        let name = match s(&r["name"]) {
            n if n.is_empty() => String::new(),
            n => format!(" \"{n}\""),
        };
        let source = &r["source"];
        let from = if let Some(x) = source.get("xds") {
            format!("xDS resource {}", s(x))
        } else if source.get("request").is_some() {
            "a limit the request supplied".to_string()
        } else {
            match source["line"].as_u64() {
                Some(line) => format!("{}, line {line}", s(&source["file"])),
                None => s(&source["file"]),
            }
        };
        let _ = writeln!(out, "  rule {}{name} ({from})", s(&r["full_key"]));
        if let Some(parent) = r.get("override_of") {
            let _ = writeln!(out, "  an override of {}", s(parent));
        }
        if let Some(exact) = r.get("exact") {
            let _ = writeln!(out, "  exact: counts from {}", s(exact));
        }
        if let Some(by) = d.get("replaced_by") {
            let _ = writeln!(out, "  replaced by {} in this request: not counted", s(by));
            continue;
        }
        if r["unlimited"].as_bool() == Some(true) {
            out.push_str("  unlimited: never counted or denied\n");
            continue;
        }
        for (j, l) in d["limits"].as_array().unwrap_or(&empty).iter().enumerate() {
            let per = match l.get("unit_multiplier") {
                Some(m) => format!("{m} {}", s(&l["unit"])),
                None => s(&l["unit"]),
            };
            let mut what = format!("{} per {per}", l["requests_per_unit"]);
            if let Some(b) = l.get("burst") {
                let _ = write!(what, ", burst {b}");
            }
            let _ = writeln!(
                out,
                "  limit {}: {} {what}: count {}, remaining {}, resets in {}s -> {}",
                j + 1,
                s(&l["algorithm"]),
                l["count"],
                l["remaining"],
                l["reset_seconds"],
                s(&l["decision"])
            );
        }
        let _ = write!(out, "  decision {}", s(&d["decision"]));
        if r["shadow_mode"].as_bool() == Some(true) && s(&d["decision"]) == "OVER_LIMIT" {
            out.push_str(", answered OK (shadow_mode)");
        }
        out.push('\n');
    }
    out
}
