//! Help for the usual slips in a rules file: what a raw YAML error (a tab, a line indented
//! out of step) most likely means, and the known key an unknown one is a misspelling of.
//! libyaml's own words ("found character that cannot start any token") name the symptom,
//! not the cause.

/// The cause of a YAML syntax error in `content`, in words, when it is a usual one: a tab
/// in the indentation (YAML allows spaces only), or a line indented out of step with the
/// lines around it.
pub(crate) fn yaml(e: &serde_yaml::Error, content: &str) -> Option<&'static str> {
    let message = e.to_string();
    // libyaml names some tabs itself; others it reports as a character that cannot start
    // a token, at the line whose indentation holds it.
    let line = e
        .location()
        .and_then(|at| content.lines().nth(at.line().checked_sub(1)?));
    let indent_tab = line.is_some_and(|l| {
        l.chars()
            .take_while(|c| c.is_whitespace())
            .any(|c| c == '\t')
    });
    if indent_tab || message.contains("tab character") {
        return Some("YAML does not allow tabs for indentation; use spaces");
    }
    const OUT_OF_STEP: [&str; 3] = [
        "mapping values are not allowed in this context",
        "did not find expected key",
        "did not find expected '-' indicator",
    ];
    OUT_OF_STEP.iter().any(|m| message.contains(m)).then_some(
        "check the indentation: the keys of one mapping start in one column (a list \
         entry's keys line up after its '- '), and a value holding ': ' needs quotes",
    )
}

/// The one of `known` that `key` is most likely a misspelling of: the nearest by edit
/// distance (a swap of two neighbours counts one), if it is near enough to be the one meant,
/// at most two edits or a third of the key, and fewer edits than the key has characters.
pub(crate) fn did_you_mean<'k>(
    key: &str,
    known: impl IntoIterator<Item = &'k str>,
) -> Option<&'k str> {
    let len = key.chars().count();
    let near = 2.max(len / 3).min(len.saturating_sub(1));
    known
        .into_iter()
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= near)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbouring characters, each one edit.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the table: two back (for swaps), the last, the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_each_edit_and_a_swap_as_one() {
        assert_eq!(distance("unit", "unit"), 0);
        assert_eq!(distance("uint", "unit"), 1);
        assert_eq!(distance("rate_limt", "rate_limit"), 1);
        assert_eq!(distance("shadowmode", "shadow_mode"), 1);
        assert_eq!(distance("", "key"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggests_only_a_near_key() {
        let known = ["key", "value", "rate_limit", "requests_per_unit", "unit"];
        let guess = |k| did_you_mean(k, known);
        assert_eq!(guess("rate_limt"), Some("rate_limit"));
        assert_eq!(guess("valeu"), Some("value"));
        assert_eq!(guess("uint"), Some("unit"));
        assert_eq!(guess("requests_per_second"), Some("requests_per_unit"));
        // Far from every known key, or too short to tell.
        assert_eq!(guess("bogus"), None);
        assert_eq!(guess("ab"), None);
        assert_eq!(guess("limits"), None);
    }

    #[test]
    fn a_tab_or_a_line_out_of_step_gets_its_hint() {
        let hint = |text: &str| {
            let e = serde_yaml::from_str::<serde_yaml::Value>(text).unwrap_err();
            yaml(&e, text)
        };
        let tab = Some("YAML does not allow tabs for indentation; use spaces");
        assert_eq!(hint("domain: d\ndescriptors:\n\t- key: k\n"), tab);
        assert_eq!(
            hint("domain: d\ndescriptors:\n  - key: k\n    \tvalue: v\n"),
            tab
        );
        let step = hint("domain: d\ndescriptors:\n  - key: k\n  value: v\n").unwrap();
        assert!(step.starts_with("check the indentation"), "{step}");
        assert!(hint("domain: d\n descriptors: []\n").is_some());
        // Not a slip of indentation: no hint that would mislead.
        assert_eq!(hint("domain: d\ndescriptors: [\n"), None);
    }
}
