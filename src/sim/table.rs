//! What `sluice simulate` prints: every scenario's reports as Markdown tables, the windows'
//! and the buckets'.

use std::fmt::Write as _;

use super::{run, scenarios, Report};

/// Runs every scenario and renders the table (what `sluice simulate` prints).
pub fn run_all() -> String {
    let reports: Vec<Report> = scenarios().iter().map(run).collect();
    let mut out = String::from(
        "Fleet simulation: sluice (the production request path and sync task, on simulated \
         time) beside the plain design (decay of the last count read, reads on the tier \
         cadence), on the same traffic.\n\
         False denials: hits the exact limiter would have admitted, as a share of the limit \
         (of a bucket: of the exact bucket's admitted hits).\n\n",
    );
    out.push_str(&render_table(&reports));
    out
}

/// Markdown tables: one row per window scenario and window, sluice beside the plain design;
/// then, when there are any, one row per bucket scenario and period, sluice beside an exact
/// bucket fed the same arrivals.
pub fn render_table(reports: &[Report]) -> String {
    let (buckets, windows): (Vec<&Report>, Vec<&Report>) =
        reports.iter().partition(|r| r.burst.is_some());
    let mut out = String::new();
    if !windows.is_empty() {
        out.push_str(&window_table(&windows));
    }
    if !buckets.is_empty() {
        if !windows.is_empty() {
            out.push('\n');
        }
        out.push_str(&bucket_table(&buckets));
    }
    out
}

fn window_table(reports: &[&Report]) -> String {
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

/// The buckets' table: per period, the hits offered, admitted by the exact bucket and by
/// sluice, their ratio, and sluice's false denials over the exact bucket's admitted hits.
/// The plain design is a window's, so it has no column here.
fn bucket_table(reports: &[&Report]) -> String {
    let mut out = String::new();
    out.push_str(
        "| bucket scenario | refill/window, burst | period (s) | offered | exact bucket admitted \
         | sluice admitted | sluice/exact | sluice false denials |\n",
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in reports {
        for (i, s) in r.sluice.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {}, {} | {} | {} | {} | {} | {:.3} | {:.1} % |",
                r.scenario,
                r.limit,
                r.burst.unwrap_or(0),
                format_args!(
                    "{}–{}",
                    i as u64 * r.period_ms / 1000,
                    (i as u64 + 1) * r.period_ms / 1000
                ),
                s.offered,
                s.exact_admitted,
                s.admitted,
                r.sluice_admitted(i),
                100.0 * r.sluice_false_denials(i),
            );
        }
    }
    out
}
