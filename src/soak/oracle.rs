//! The oracle of the soak harnesses (RELIABILITY.md): an `append` sink outside the data
//! dir, one fsynced `LINE<TAB>EFFECT_ID` per delivery, read back and counted.

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The sink's deliveries as (line, effect id), in order; a missing sink has none, and a
/// line without a tab is kept whole with an empty effect id.
pub fn sink_lines(sink: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(sink).unwrap_or_default();
    text.lines()
        .map(|line| match line.split_once('\t') {
            Some((what, effect)) => (what.to_owned(), effect.to_owned()),
            None => (line.to_owned(), String::new()),
        })
        .collect()
}

/// Deliveries counted against what was expected (I1, I8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    pub deliveries: usize,
    /// Deliveries of a line or an effect already delivered.
    pub duplicates: usize,
    /// Expected lines never delivered.
    pub lost: usize,
}

/// Counts the sink's deliveries against the lines expected.
pub fn tally(sink: &Path, expected: &[String]) -> Tally {
    let lines = sink_lines(sink);
    let mut seen_lines: HashMap<&str, usize> = HashMap::new();
    let mut seen_effects = HashSet::new();
    let mut duplicates = 0;
    for (line, effect) in &lines {
        let again = *seen_lines.entry(line).and_modify(|n| *n += 1).or_insert(1) > 1;
        let effect_again = !seen_effects.insert(effect.as_str());
        duplicates += usize::from(again || effect_again);
    }
    let lost = expected
        .iter()
        .filter(|line| !seen_lines.contains_key(line.as_str()))
        .count();
    Tally {
        deliveries: lines.len(),
        duplicates,
        lost,
    }
}
