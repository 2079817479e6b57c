//! The experiment suite: every claim of the project as a scenario, run with
//! MetaRoCE and every baseline, checked against its target, and written out
//! as the tables of `RESULTS.md` (and, per experiment, as a figure:
//! [`crate::plot::experiment_svg`]).
//!
//! A suite is a directory with a `suite.toml`:
//!
//! ```toml
//! transports = ["metaroce", "rocev2", "irn", "ib"]
//!
//! [[experiment]]
//! id = "loss-perm"
//! title = "Permutation 2 MB, 128-host fat tree, random loss per link"
//! scenario = "loss-perm.toml"            # relative to the suite
//! sweep = { "switch.loss" = [0.001, 0.01] }  # one row per value (optional)
//! set = { "transport.paths" = 16 }        # applied to every run (optional)
//! reference = { "switch.loss" = 0.0 }     # a reference run per transport (optional)
//!
//! [[experiment.target]]
//! label = "goodput >= 85 % of loss-free at 1 %/link"
//! metric = "goodput_gbps"                 # a results.json path or a named metric
//! vs = "reference"                        # or a transport, or absent
//! min = 0.85                              # and/or max
//! when = { "switch.loss" = 0.01 }         # only these rows (optional)
//! ```
//!
//! A metric is a dotted path into `results.json` (`makespan_us`,
//! `collectives.0.settle_rtts`, `fabric.data_lost`, `failures.0.data_quiet_after_us`)
//! or one of the named figures of [`named_metric`]. With `vs = "reference"`
//! the value is divided by the same transport's reference run (times the
//! ratio of `scale_by` between the two, for per-plane efficiency); with
//! `vs = "ib"` by that transport's run of the same row. Targets apply to
//! MetaRoCE unless they name another `transport`.

use crate::error::SimError;
use crate::report::Results;
use crate::run::run_scenario;
use crate::scenario::Scenario;
use crate::sweep::set_dotted;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A target of an experiment.
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// What it says, for the table.
    pub label: String,
    /// The figure.
    pub metric: String,
    /// `reference`, a transport name, or absent (the value itself).
    #[serde(default)]
    pub vs: Option<String>,
    /// With `vs = "reference"`: scale the reference by this scenario key's
    /// ratio between the row and the reference (e.g. `topology.planes`).
    #[serde(default)]
    pub scale_by: Option<String>,
    /// Lowest acceptable value.
    #[serde(default)]
    pub min: Option<f64>,
    /// Highest acceptable value.
    #[serde(default)]
    pub max: Option<f64>,
    /// The transport it applies to (default `metaroce`).
    #[serde(default)]
    pub transport: Option<String>,
    /// Only rows whose sweep value matches.
    #[serde(default)]
    pub when: BTreeMap<String, toml::Value>,
}

/// One experiment.
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    /// Short id (`--only` matches it).
    pub id: String,
    /// Title in the tables.
    pub title: String,
    /// Scenario file, relative to the suite.
    pub scenario: String,
    /// Overrides for every run.
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
    /// One key and its values: a row each.
    #[serde(default)]
    pub sweep: BTreeMap<String, Vec<toml::Value>>,
    /// Overrides making the reference run (on top of `set`).
    #[serde(default)]
    pub reference: Option<BTreeMap<String, toml::Value>>,
    /// Targets.
    #[serde(default)]
    pub target: Vec<TargetSpec>,
    /// The figure shown per transport in the table (default: the first
    /// target's metric, absolute).
    #[serde(default)]
    pub show: Option<String>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    #[serde(default = "all_transports")]
    transports: Vec<String>,
    /// Overrides per transport, for every run of it (RoCEv2 as deployed
    /// runs with PFC on: `rocev2 = { "switch.pfc" = true }`).
    #[serde(default)]
    transport_set: BTreeMap<String, BTreeMap<String, toml::Value>>,
    experiment: Vec<ExperimentSpec>,
}

fn all_transports() -> Vec<String> {
    crate::scenario::TRANSPORTS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A loaded suite.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Its directory.
    pub dir: PathBuf,
    /// Transports every experiment runs with.
    pub transports: Vec<String>,
    /// Overrides per transport.
    pub transport_set: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// Experiments in file order.
    pub experiments: Vec<ExperimentSpec>,
    /// Scenario texts by file name, for a suite built into the binary
    /// ([`Suite::embedded`]); empty: scenarios are read from `dir`.
    pub embedded: BTreeMap<String, String>,
}

/// One row's value of one transport, and the verdict of each target.
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
pub struct RowResult {
    /// `key=value` of the sweep, or empty.
    pub variant: String,
    /// The shown figure per transport (`None`: the run failed).
    pub shown: BTreeMap<String, Option<f64>>,
    /// Each target: label, value (after `vs`), met.
    pub targets: Vec<(String, Option<f64>, bool)>,
    /// Errors of runs of this row.
    pub errors: Vec<String>,
}

/// One experiment's outcome (a suite run's JSON is a list of them; read
/// one back with [`read_results`]).
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
pub struct ExperimentResult {
    /// Id.
    pub id: String,
    /// Title.
    pub title: String,
    /// The shown figure's name.
    pub shown: String,
    /// Rows.
    pub rows: Vec<RowResult>,
    /// The command that reruns it.
    pub command: String,
}

/// A run to do: scenario text, transport.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RunKey {
    experiment: usize,
    /// Overrides, serialized (stable order).
    overrides: String,
    transport: String,
}

impl Suite {
    /// Read `dir/suite.toml` and check that every run builds.
    pub fn load(dir: &Path) -> Result<Self, SimError> {
        let path = dir.join("suite.toml");
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| SimError::Scenario(format!("{origin}: {e}")))?;
        Self::parse(dir, &origin, &text, BTreeMap::new())
    }

    /// A suite built into the binary: its `suite.toml` text and its
    /// scenario files' texts by name; `dir` names it in rerun commands.
    pub fn embedded(
        dir: &Path,
        suite_text: &str,
        files: &[(&str, &str)],
    ) -> Result<Self, SimError> {
        let origin = dir.join("suite.toml").display().to_string();
        let embedded = files
            .iter()
            .map(|(name, text)| ((*name).to_string(), (*text).to_string()))
            .collect();
        Self::parse(dir, &origin, suite_text, embedded)
    }

    fn parse(
        dir: &Path,
        origin: &str,
        text: &str,
        embedded: BTreeMap<String, String>,
    ) -> Result<Self, SimError> {
        let origin = origin.to_string();
        let f: SuiteFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| {
                text[..s.start.min(text.len())].matches('\n').count() + 1
            });
            SimError::Scenario(format!(
                "{origin}:{line}: {}",
                e.message().replace('\n', " ")
            ))
        })?;
        for t in &f.transports {
            if !crate::scenario::TRANSPORTS.contains(&t.as_str()) {
                return Err(SimError::Scenario(format!(
                    "{origin}: unknown transport '{t}'"
                )));
            }
        }
        let suite = Self {
            dir: dir.to_path_buf(),
            transports: f.transports,
            transport_set: f.transport_set,
            experiments: f.experiment,
            embedded,
        };
        for (i, e) in suite.experiments.iter().enumerate() {
            if e.sweep.len() > 1 {
                return Err(SimError::Scenario(format!(
                    "{origin}: experiment {}: sweep one key at a time",
                    e.id
                )));
            }
            for t in &e.target {
                if t.min.is_none() && t.max.is_none() {
                    return Err(SimError::Scenario(format!(
                        "{origin}: experiment {}: target '{}' needs min or max",
                        e.id, t.label
                    )));
                }
                if t.vs.as_deref() == Some("reference") && e.reference.is_none() {
                    return Err(SimError::Scenario(format!(
                        "{origin}: experiment {}: target '{}' is vs reference, but there is no reference",
                        e.id, t.label
                    )));
                }
            }
            for ov in suite
                .row_overrides(i)
                .into_iter()
                .chain(suite.reference_overrides(i))
            {
                suite.scenario(i, &ov)?;
            }
        }
        Ok(suite)
    }

    fn row_overrides(&self, i: usize) -> Vec<Vec<(String, toml::Value)>> {
        let e = &self.experiments[i];
        let base: Vec<(String, toml::Value)> =
            e.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        match e.sweep.iter().next() {
            None => vec![base],
            Some((k, vals)) => vals
                .iter()
                .map(|v| {
                    let mut o = base.clone();
                    o.push((k.clone(), v.clone()));
                    o
                })
                .collect(),
        }
    }

    fn reference_overrides(&self, i: usize) -> Option<Vec<(String, toml::Value)>> {
        let e = &self.experiments[i];
        let r = e.reference.as_ref()?;
        let mut o: Vec<(String, toml::Value)> =
            e.set.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        o.extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
        Some(o)
    }

    /// The scenario of experiment `i` with `overrides`.
    pub fn scenario(
        &self,
        i: usize,
        overrides: &[(String, toml::Value)],
    ) -> Result<Scenario, SimError> {
        let e = &self.experiments[i];
        let path = self.dir.join(&e.scenario);
        let origin = path.display().to_string();
        let text = match self.embedded.get(&e.scenario) {
            Some(text) => text.clone(),
            None if !self.embedded.is_empty() => {
                return Err(SimError::Scenario(format!(
                    "{origin}: not among the embedded scenarios"
                )));
            }
            None => std::fs::read_to_string(&path)
                .map_err(|err| SimError::Scenario(format!("{origin}: {err}")))?,
        };
        let mut table: toml::Table = text.parse().map_err(|err: toml::de::Error| {
            SimError::Scenario(format!("{origin}: {}", err.message()))
        })?;
        for (k, v) in overrides {
            set_dotted(&mut table, k, v.clone())?;
        }
        let text = toml::to_string(&table).map_err(|err| SimError::Scenario(err.to_string()))?;
        Scenario::parse(&text, &origin)
            .map_err(|err| SimError::Scenario(format!("experiment {}: {err}", e.id)))
    }

    /// Whether `only` (a comma-separated list of id fragments; empty:
    /// everything) selects the experiment `id`.
    pub fn selects(only: &str, id: &str) -> bool {
        only.is_empty() || fragments(only).any(|part| id.contains(part))
    }

    /// The fragments of `only` that select no experiment (a typo the user
    /// should hear about before anything runs).
    pub fn unmatched<'a>(&self, only: &'a str) -> Vec<&'a str> {
        fragments(only)
            .filter(|part| !self.experiments.iter().any(|e| e.id.contains(part)))
            .collect()
    }

    /// Run the experiments `only` selects ([`Suite::selects`]) on
    /// `threads` threads; `progress(done, total, what)`.
    pub fn run(
        &self,
        only: &str,
        threads: usize,
        progress: &mut (dyn FnMut(usize, usize, &str) + Send),
    ) -> Vec<ExperimentResult> {
        let chosen: Vec<usize> = (0..self.experiments.len())
            .filter(|&i| Self::selects(only, &self.experiments[i].id))
            .collect();
        let mut keys: Vec<(RunKey, Vec<(String, toml::Value)>)> = Vec::new();
        for &i in &chosen {
            for ov in self
                .row_overrides(i)
                .into_iter()
                .chain(self.reference_overrides(i))
            {
                for t in &self.transports {
                    let key = RunKey {
                        experiment: i,
                        overrides: ov_key(&ov),
                        transport: t.clone(),
                    };
                    if !keys.iter().any(|(k, _)| *k == key) {
                        keys.push((key, ov.clone()));
                    }
                }
            }
        }
        let next = AtomicUsize::new(0);
        let done: Mutex<BTreeMap<RunKey, Result<Results, String>>> = Mutex::new(BTreeMap::new());
        let progress = Mutex::new(progress);
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, keys.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let Some((key, ov)) = keys.get(n) else { break };
                        let mut ov = ov.clone();
                        if let Some(extra) = self.transport_set.get(&key.transport) {
                            ov.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
                        }
                        let r = self
                            .scenario(key.experiment, &ov)
                            .map_err(|e| e.to_string())
                            .and_then(|mut scn| {
                                scn.transport.kind.clone_from(&key.transport);
                                run_scenario(&scn, None, &mut |_, _, _, _| {})
                                    .map(|o| o.results)
                                    .map_err(|e| e.to_string())
                            });
                        let what = format!(
                            "{} {} {}",
                            self.experiments[key.experiment].id, key.overrides, key.transport
                        );
                        let mut d = done.lock().expect("results");
                        d.insert(key.clone(), r);
                        let count = d.len();
                        drop(d);
                        (progress.lock().expect("progress"))(count, keys.len(), &what);
                    }
                });
            }
        });
        let done = done.into_inner().expect("results");
        chosen.iter().map(|&i| self.judge(i, &done)).collect()
    }

    fn judge(
        &self,
        i: usize,
        done: &BTreeMap<RunKey, Result<Results, String>>,
    ) -> ExperimentResult {
        let e = &self.experiments[i];
        let get = |ov: &[(String, toml::Value)], t: &str| {
            done.get(&RunKey {
                experiment: i,
                overrides: ov_key(ov),
                transport: t.to_string(),
            })
        };
        let shown = e
            .show
            .clone()
            .or_else(|| e.target.first().map(|t| t.metric.clone()))
            .unwrap_or_else(|| "makespan_us".into());
        let reference = self.reference_overrides(i);
        let mut rows = Vec::new();
        for ov in self.row_overrides(i) {
            let variant = e
                .sweep
                .keys()
                .next()
                .and_then(|k| ov.iter().find(|(ok, _)| ok == k))
                .map_or(String::new(), |(k, v)| format!("{k}={v}"));
            let mut row = RowResult {
                variant,
                shown: BTreeMap::new(),
                targets: Vec::new(),
                errors: Vec::new(),
            };
            for t in &self.transports {
                match get(&ov, t) {
                    Some(Ok(r)) => {
                        row.shown.insert(t.clone(), metric(r, &shown));
                    }
                    Some(Err(err)) => {
                        row.shown.insert(t.clone(), None);
                        row.errors.push(format!("{t}: {err}"));
                    }
                    None => {
                        row.shown.insert(t.clone(), None);
                    }
                }
            }
            for tg in &e.target {
                let applies = tg
                    .when
                    .iter()
                    .all(|(k, v)| ov.iter().any(|(ok, ov)| ok == k && ov == v));
                if !applies {
                    continue;
                }
                let transport = tg.transport.as_deref().unwrap_or("metaroce");
                let value = (|| {
                    let Some(Ok(r)) = get(&ov, transport) else {
                        return None;
                    };
                    let v = metric(r, &tg.metric)?;
                    match tg.vs.as_deref() {
                        None => Some(v),
                        Some("reference") => {
                            let rov = reference.as_ref()?;
                            let Some(Ok(rr)) = get(rov, transport) else {
                                return None;
                            };
                            let mut base = metric(rr, &tg.metric)?;
                            if let Some(k) = &tg.scale_by {
                                base *= key_number(&ov, k)? / key_number(rov, k)?;
                            }
                            (base != 0.0).then(|| v / base)
                        }
                        Some(other) => {
                            let Some(Ok(rr)) = get(&ov, other) else {
                                return None;
                            };
                            let base = metric(rr, &tg.metric)?;
                            (base != 0.0).then(|| v / base)
                        }
                    }
                })();
                let met = value.is_some_and(|v| {
                    tg.min.is_none_or(|m| v >= m) && tg.max.is_none_or(|m| v <= m)
                });
                row.targets.push((tg.label.clone(), value, met));
            }
            rows.push(row);
        }
        ExperimentResult {
            id: e.id.clone(),
            title: e.title.clone(),
            shown,
            rows,
            command: format!("metaroce sim suite {} --only {}", self.dir.display(), e.id),
        }
    }
}

fn ov_key(ov: &[(String, toml::Value)]) -> String {
    let mut v: Vec<String> = ov.iter().map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    v.join(",")
}

fn key_number(ov: &[(String, toml::Value)], key: &str) -> Option<f64> {
    ov.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
}

/// Named figures computed from a run's results:
/// - `line_rate_fraction`: goodput over all hosts' line rate;
/// - `resent_fraction`: data packets resent per data packet sent new;
/// - `rto_per_flow`: retransmission timeouts per flow;
/// - `failed_flows`: flows that ended in an error;
/// - `max_quiet_after_us`: over every failure, the longer of data's and
///   ACKs' time to stop running into it;
/// - `failure_goodput_drop`: 1 - goodput during the first failure over
///   goodput before it; `failure_goodput_recovered`: goodput after its
///   recovery over before;
/// - `drain_ratio:NAME`: the group's time over its bytes at one host's line
///   rate (an incast's ideal drain);
/// - `group:NAME.FIELD`: a field of the group whose name starts with NAME;
/// - `worst:PREFIX.FIELD` / `best:PREFIX.FIELD`: the largest / smallest
///   field over groups whose name starts with PREFIX.
pub fn named_metric(r: &Results, name: &str) -> Option<f64> {
    match name {
        "line_rate_fraction" => {
            let line = r.line_rate_gbps * f64::from(r.hosts);
            (line > 0.0).then(|| r.goodput_gbps / line)
        }
        "resent_fraction" => {
            let t = &r.transport_stats;
            (t.data_packets > 0).then(|| t.retransmissions as f64 / t.data_packets as f64)
        }
        "rto_per_flow" => {
            (r.fct.flows > 0).then(|| r.transport_stats.timeouts as f64 / r.fct.flows as f64)
        }
        "failed_flows" => Some(r.fct.failed as f64),
        "failure_goodput_drop" => {
            let f = r.failures.first()?;
            (f.goodput_before_gbps > 0.0)
                .then(|| 1.0 - f.goodput_during_gbps / f.goodput_before_gbps)
        }
        "failure_goodput_recovered" => {
            let f = r.failures.first()?;
            (f.goodput_before_gbps > 0.0).then(|| f.goodput_after_gbps / f.goodput_before_gbps)
        }
        "max_quiet_after_us" => Some(
            r.failures
                .iter()
                .map(|f| f.data_quiet_after_us.max(f.acks_quiet_after_us))
                .fold(0.0, f64::max),
        ),
        _ => {
            let (kind, rest) = name.split_once(':')?;
            if kind == "drain_ratio" {
                // A group's time over the ideal: its bytes at one host's
                // line rate (an incast's bytes all go through the receiver).
                let c = r.collectives.iter().find(|c| c.name.starts_with(rest))?;
                let ideal_us = c.bytes as f64 * 8.0 / (r.line_rate_gbps * 1e3);
                return (ideal_us > 0.0).then(|| c.time_us / ideal_us);
            }
            let (prefix, field) = rest.rsplit_once('.')?;
            let vals = r
                .collectives
                .iter()
                .filter(|c| c.name.starts_with(prefix))
                .filter_map(|c| {
                    let v = serde_json::to_value(c).ok()?;
                    v.get(field)?.as_f64()
                });
            match kind {
                "group" => vals.into_iter().next(),
                "worst" => vals.fold(None, |a, v| Some(a.map_or(v, |a: f64| a.max(v)))),
                "best" => vals.fold(None, |a, v| Some(a.map_or(v, |a: f64| a.min(v)))),
                _ => None,
            }
        }
    }
}

/// A figure of `r`: a named one, or a dotted path into its JSON.
pub fn metric(r: &Results, name: &str) -> Option<f64> {
    if let Some(v) = named_metric(r, name) {
        return Some(v);
    }
    let mut cur = serde_json::to_value(r).ok()?;
    for part in name.split('.') {
        cur = match cur {
            serde_json::Value::Array(a) => a.into_iter().nth(part.parse().ok()?)?,
            serde_json::Value::Object(mut o) => o.remove(part)?,
            _ => return None,
        };
    }
    cur.as_f64()
        .or_else(|| cur.as_bool().map(|b| f64::from(u8::from(b))))
}

/// Format a figure for a table or a figure's note.
pub(crate) fn format_figure(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x.abs() >= 1000.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
    }
}

/// The results as Markdown: per experiment, a table of the shown figure
/// per transport and row, then every target with its value and verdict.
pub fn markdown(transports: &[String], results: &[ExperimentResult]) -> String {
    let mut s = String::new();
    let (mut met, mut total) = (0, 0);
    for e in results {
        let _ = writeln!(s, "### {} (`{}`)\n", e.title, e.id);
        let _ = writeln!(s, "`{}` per transport:\n", e.shown);
        let _ = write!(s, "| row |");
        for t in transports {
            let _ = write!(s, " {t} |");
        }
        let _ = writeln!(s, "\n|---|{}", "---|".repeat(transports.len()));
        for r in &e.rows {
            let _ = write!(
                s,
                "| {} |",
                if r.variant.is_empty() {
                    "—"
                } else {
                    &r.variant
                }
            );
            for t in transports {
                let _ = write!(s, " {} |", format_figure(r.shown.get(t).copied().flatten()));
            }
            let _ = writeln!(s);
        }
        let judged = e
            .rows
            .iter()
            .any(|r| !r.targets.is_empty() || !r.errors.is_empty());
        if judged {
            let _ = writeln!(s, "\n| row | target | MetaRoCE | met |\n|---|---|---|---|");
        }
        for r in &e.rows {
            for (label, v, ok) in &r.targets {
                total += 1;
                met += usize::from(*ok);
                let _ = writeln!(
                    s,
                    "| {} | {label} | {} | {} |",
                    if r.variant.is_empty() {
                        "—"
                    } else {
                        &r.variant
                    },
                    format_figure(*v),
                    if *ok { "met" } else { "**not met**" }
                );
            }
            for err in &r.errors {
                let _ = writeln!(s, "| {} | run failed: {err} | | |", r.variant);
            }
        }
        let _ = writeln!(s, "\nRerun: `{}`\n", e.command);
    }
    let _ = writeln!(s, "**{met} of {total} targets met.**");
    s
}

/// Read back the results a suite run wrote as JSON (`FILE.json` beside
/// `--out FILE`), to draw them again without running anything. Every
/// error is one line naming the file and what is wrong: unreadable, not
/// such a list, empty, or an experiment id that cannot name its figure's
/// file.
pub fn read_results(path: &Path) -> Result<Vec<ExperimentResult>, SimError> {
    let origin = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| SimError::Scenario(format!("{origin}: {e}")))?;
    let results: Vec<ExperimentResult> = serde_json::from_str(&text).map_err(|e| {
        SimError::Scenario(format!(
            "{origin}: not the JSON of a suite run (FILE.json of `metaroce sim suite --out FILE`): {}",
            e.to_string().replace('\n', " ")
        ))
    })?;
    if results.is_empty() {
        return Err(SimError::Scenario(format!(
            "{origin}: holds no experiments"
        )));
    }
    for (i, e) in results.iter().enumerate() {
        crate::plot::plot_file_name(&e.id)
            .map_err(|why| SimError::Scenario(format!("{origin}: experiment {}: {why}", i + 1)))?;
        if results[..i].iter().any(|earlier| earlier.id == e.id) {
            return Err(SimError::Scenario(format!(
                "{origin}: experiment id '{}' appears twice (its figures would overwrite each other)",
                e.id
            )));
        }
    }
    Ok(results)
}

/// The non-empty, trimmed parts of a comma-separated `--only`.
fn fragments(only: &str) -> impl Iterator<Item = &str> {
    only.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
}

#[cfg(test)]
mod tests {
    use super::Suite;

    #[test]
    fn only_selects_any_fragment_of_a_comma_list() {
        assert!(Suite::selects("", "plane-scaling"));
        assert!(Suite::selects("plane", "fail-plane-4"));
        assert!(Suite::selects("loss, plane", "fail-plane-4"));
        assert!(Suite::selects("loss,plane", "loss-link-perm"));
        assert!(!Suite::selects("incast", "fail-plane-4"));
        assert!(!Suite::selects(",", "fail-plane-4"));
    }
}
