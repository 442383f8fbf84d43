//! What `sluice simulate` prints: every scenario's reports as one Markdown table.

use std::fmt::Write as _;

use super::{run, scenarios, Report};

/// Runs every scenario and renders the table (what `sluice simulate` prints).
pub fn run_all() -> String {
    let reports: Vec<Report> = scenarios().iter().map(run).collect();
    let mut out = String::from(
        "Fleet simulation: sluice (the production request path and sync task, on simulated \
         time) beside the plain design (decay of the last count read, reads on the tier \
         cadence), on the same traffic.\n\
         False denials: hits the exact limiter would have admitted, as a share of the limit.\n\n",
    );
    out.push_str(&render_table(&reports));
    out
}

/// A Markdown table: one row per scenario and window, sluice beside the plain design.
pub fn render_table(reports: &[Report]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | window | offered/limit | sluice admitted/limit | plain admitted/limit \
         | sluice false denials | plain false denials |\n",
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in reports {
        let limit = f64::from(r.limit);
        for (i, (s, b)) in r.sluice.iter().zip(&r.baseline).enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.3} | {:.3} | {:.1} % | {:.1} % |",
                r.scenario,
                i + 1,
                s.offered as f64 / limit,
                s.admitted as f64 / limit,
                b.admitted as f64 / limit,
                100.0 * s.false_denials as f64 / limit,
                100.0 * b.false_denials as f64 / limit,
            );
        }
    }
    out
}
