//! The outcome of a run: one verdict per check.

use std::fmt;

use crate::catalogue::{CHECKS, CheckSpec, Level};

/// The verdict of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The target did what the spec says.
    Pass,
    /// It did not; the text says what was seen.
    Fail(String),
    /// Not run; the text says why (not selected, not applicable, or an
    /// earlier step it depends on failed).
    Skipped(String),
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// The check.
    pub spec: &'static CheckSpec,
    /// Its verdict.
    pub outcome: Outcome,
}

/// Every check's result, in catalogue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// One entry per check of [`CHECKS`].
    pub results: Vec<CheckResult>,
}

impl Report {
    /// Checks that passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Pass))
    }

    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Fail(_)))
    }

    /// Checks not run.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skipped(_)))
    }

    /// Whether no check failed (a MUST or a SHOULD).
    pub fn all_passed(&self) -> bool {
        self.failed() == 0
    }

    /// The result of check `id`.
    pub fn get(&self, id: &str) -> Option<&CheckResult> {
        self.results.iter().find(|r| r.spec.id == id)
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
}

impl fmt::Display for Report {
    /// One line per check, then a closing `N passed, N failed, N skipped`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            let level = match r.spec.level {
                Level::Must => "",
                Level::Should => " (SHOULD)",
            };
            match &r.outcome {
                Outcome::Pass => writeln!(f, "PASS {} [{}]{level}", r.spec.id, r.spec.section)?,
                Outcome::Fail(why) => writeln!(
                    f,
                    "FAIL {} [{}]{level}: {why}\n     expected: {}",
                    r.spec.id, r.spec.section, r.spec.expected
                )?,
                Outcome::Skipped(why) => {
                    writeln!(f, "SKIP {} [{}]: {why}", r.spec.id, r.spec.section)?
                }
            }
        }
        write!(
            f,
            "conformance: {} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

/// Collects verdicts while the scenarios run; every check ends with exactly one.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    outcomes: Vec<(&'static str, Outcome)>,
}

impl Verdicts {
    /// Record `id`'s verdict (the first one recorded stands).
    pub(crate) fn record(&mut self, id: &'static str, outcome: Outcome) {
        debug_assert!(
            crate::catalogue::spec_of(id).is_some(),
            "check {id} is not in the catalogue"
        );
        if !self.outcomes.iter().any(|(i, _)| *i == id) {
            self.outcomes.push((id, outcome));
        }
    }

    /// Record a pass, or a failure with the error text.
    pub(crate) fn check(&mut self, id: &'static str, result: Result<(), String>) {
        self.record(
            id,
            match result {
                Ok(()) => Outcome::Pass,
                Err(why) => Outcome::Fail(why),
            },
        );
    }

    /// The report, in catalogue order; checks never decided are skipped.
    pub(crate) fn into_report(self) -> Report {
        let results = CHECKS
            .iter()
            .map(|spec| CheckResult {
                spec,
                outcome: self
                    .outcomes
                    .iter()
                    .find(|(id, _)| *id == spec.id)
                    .map(|(_, o)| o.clone())
                    .unwrap_or_else(|| Outcome::Skipped("not reached".into())),
            })
            .collect();
        Report { results }
    }
}
