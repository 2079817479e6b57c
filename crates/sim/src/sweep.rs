//! Sweeps: a grid of scenario points x seeds, run in parallel on std
//! threads, each point an independent deterministic run; `--shard i/n`
//! keeps every n-th point so a cluster scheduler can split a big sweep.
//!
//! A plan names a base scenario and lists values for dotted keys:
//!
//! ```toml
//! scenario = "../scenarios/perm-16.toml"  # relative to the plan
//! seeds = [1, 2]
//! x_axis = "transport.paths"  # sweep.svg's x axis (optional)
//! [grid]
//! "transport.paths" = [1, 4, 16]
//! "switch.loss" = [0.0, 0.01]
//! "workload.0.bytes" = { from = 100000, to = 400000, step = 100000 }
//! ```

use crate::error::SimError;
use crate::scenario::Scenario;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A parsed plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Base scenario text and its origin (for errors and relative files).
    pub base: String,
    /// Path of the base scenario.
    pub base_path: PathBuf,
    /// Seeds per point.
    pub seeds: Vec<u64>,
    /// (dotted key, values) in the order the plan's table gives them
    /// (sorted by key).
    pub grid: Vec<(String, Vec<toml::Value>)>,
    /// The grid key on the x axis of the sweep's figure (`x_axis`; by
    /// default the numeric key with the most values).
    pub x_axis: Option<String>,
}

/// One slice of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This slice, 0-based.
    pub index: usize,
    /// Slices.
    pub count: usize,
}

impl Shard {
    /// Parse `i/n`.
    pub fn parse(s: &str) -> Result<Self, SimError> {
        let (i, n) = s.split_once('/').ok_or(SimError::ShardSyntax)?;
        let index: usize = i.trim().parse().map_err(|_| SimError::ShardIndex)?;
        let count: usize = n.trim().parse().map_err(|_| SimError::ShardCount)?;
        if count == 0 || index >= count {
            return Err(SimError::ShardOutOfRange);
        }
        Ok(Self { index, count })
    }
}

/// One run of a sweep.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// Point index in the full grid (seed-major order inside a point).
    pub point: usize,
    /// Parameter values as `key=value`.
    pub params: Vec<(String, String)>,
    /// Seed.
    pub seed: u64,
    /// Whether every flow finished.
    pub finished: bool,
    /// Makespan, µs.
    pub makespan_us: f64,
    /// Median FCT, µs.
    pub fct_p50_us: f64,
    /// 99th percentile FCT, µs.
    pub fct_p99_us: f64,
    /// Goodput, Gb/s.
    pub goodput_gbps: f64,
    /// busbw of the first collective, GB/s.
    pub busbw_gbs: f64,
    /// Buffer drops.
    pub drops: u64,
    /// Retransmissions.
    pub retransmissions: u64,
    /// Error, if the point failed to build or run.
    pub error: Option<String>,
}

/// A finished sweep (or shard).
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// Rows in point order.
    pub rows: Vec<Row>,
}

impl Plan {
    /// Read a plan file.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| SimError::Scenario(format!("{origin}: {e}")))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map_or(1, |s| {
                text[..s.start.min(text.len())].matches('\n').count() + 1
            });
            SimError::Scenario(format!(
                "{origin}:{line}: {}",
                e.message().replace('\n', " ")
            ))
        })?;
        let err = |key: &str, why: &str| {
            let line = text
                .lines()
                .position(|l| l.contains(key))
                .map_or(1, |i| i + 1);
            SimError::Scenario(format!("{origin}:{line}: {key}: {why}"))
        };
        for k in table.keys() {
            if !["scenario", "seeds", "grid", "x_axis"].contains(&k.as_str()) {
                return Err(err(
                    k,
                    "unknown key (expected scenario, seeds, grid, x_axis)",
                ));
            }
        }
        let scn = table
            .get("scenario")
            .and_then(|v| v.as_str())
            .ok_or_else(|| err("scenario", "missing scenario path"))?;
        let base_path = path.parent().unwrap_or(Path::new(".")).join(scn);
        let base = std::fs::read_to_string(&base_path)
            .map_err(|e| err("scenario", &format!("{}: {e}", base_path.display())))?;
        let seeds = match table.get("seeds") {
            None => vec![1],
            Some(toml::Value::Integer(n)) if *n > 0 => (1..=*n as u64).collect(),
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| v.as_integer().filter(|&i| i >= 0).map(|i| i as u64))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| err("seeds", "must be a count or a list of seeds"))?,
            Some(_) => return Err(err("seeds", "must be a count or a list of seeds")),
        };
        let mut grid = Vec::new();
        if let Some(g) = table.get("grid") {
            let g = g.as_table().ok_or_else(|| err("grid", "must be a table"))?;
            for (k, v) in g {
                let vals = match v {
                    toml::Value::Array(a) => a.clone(),
                    toml::Value::Table(t) => {
                        let num = |n: &str| {
                            t.get(n)
                                .and_then(|x| x.as_float().or(x.as_integer().map(|i| i as f64)))
                        };
                        let (Some(from), Some(to), Some(step)) =
                            (num("from"), num("to"), num("step"))
                        else {
                            return Err(err(k, "a range needs from, to, step"));
                        };
                        if step <= 0.0 {
                            return Err(err(k, "step must be > 0"));
                        }
                        let int = t.values().all(|x| x.is_integer());
                        let mut out = Vec::new();
                        let mut x = from;
                        while x <= to + step * 1e-9 {
                            out.push(if int {
                                toml::Value::Integer(x as i64)
                            } else {
                                toml::Value::Float(x)
                            });
                            x += step;
                        }
                        out
                    }
                    other => vec![other.clone()],
                };
                grid.push((k.clone(), vals));
            }
        }
        let x_axis = match table.get("x_axis") {
            None => None,
            Some(toml::Value::String(k)) if grid.iter().any(|(g, _)| g == k) => Some(k.clone()),
            Some(_) => return Err(err("x_axis", "must name one of the [grid] keys")),
        };
        let plan = Self {
            base,
            base_path,
            seeds,
            grid,
            x_axis,
        };
        // Check every point builds before running any.
        for p in 0..plan.points() {
            plan.scenario(p)?;
        }
        Ok(plan)
    }

    /// Grid points (not counting seeds).
    pub fn points(&self) -> usize {
        self.grid.iter().map(|(_, v)| v.len()).product()
    }

    /// Parameter assignment of point `p`.
    pub fn params(&self, mut p: usize) -> Vec<(String, toml::Value)> {
        let mut out = Vec::new();
        for (k, vals) in self.grid.iter().rev() {
            out.push((k.clone(), vals[p % vals.len()].clone()));
            p /= vals.len();
        }
        out.reverse();
        out
    }

    /// `scenario name · seeds 1, 2 · transport`: what the sweep runs, for
    /// its figure (`transport from the grid` when the grid sets it).
    pub fn describe(&self) -> String {
        let name = self
            .scenario(0)
            .map_or_else(|_| self.base_path.display().to_string(), |s| s.name);
        let transport = if self.grid.iter().any(|(k, _)| k == "transport.kind") {
            "transport from the grid".to_string()
        } else {
            self.scenario(0)
                .map_or_else(|_| "metaroce".into(), |s| s.transport.kind)
        };
        let seeds = match self.seeds.as_slice() {
            [one] => format!("seed {one}"),
            [first, .., last]
                if self.seeds.len() > 3 && self.seeds.windows(2).all(|w| w[1] == w[0] + 1) =>
            {
                format!("seeds {first}–{last}")
            }
            all => format!(
                "seeds {}",
                all.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!("{name} · {seeds} · {transport}")
    }

    /// The scenario of point `p`.
    pub fn scenario(&self, p: usize) -> Result<Scenario, SimError> {
        let origin = self.base_path.display().to_string();
        let mut table: toml::Table = self.base.parse().map_err(|e: toml::de::Error| {
            SimError::Scenario(format!("{origin}: {}", e.message()))
        })?;
        for (key, val) in self.params(p) {
            set_dotted(&mut table, &key, val)?;
        }
        let text = toml::to_string(&table).map_err(|e| SimError::Scenario(e.to_string()))?;
        Scenario::parse(&text, &origin)
            .map_err(|e| SimError::Scenario(format!("grid point {p}: {e}")))
    }
}

/// Set the value at dotted `key` (`a.b`, `workload.0.bytes`) in `t`.
pub(crate) fn set_dotted(t: &mut toml::Table, key: &str, val: toml::Value) -> Result<(), SimError> {
    fn walk<'a>(mut cur: &'a mut toml::Value, key: &str) -> Result<&'a mut toml::Value, SimError> {
        let bad = |why: String| SimError::Scenario(format!("grid key {key}: {why}"));
        for part in key.split('.') {
            cur = match cur {
                toml::Value::Table(tb) => tb
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new())),
                toml::Value::Array(a) => {
                    let i: usize = part
                        .parse()
                        .map_err(|_| bad(format!("'{part}' is not an index")))?;
                    a.get_mut(i)
                        .ok_or_else(|| bad(format!("index {i} out of range")))?
                }
                _ => return Err(bad(format!("'{part}' is inside a value"))),
            };
        }
        Ok(cur)
    }
    let mut root = toml::Value::Table(std::mem::take(t));
    let r = walk(&mut root, key).map(|slot| *slot = val);
    if let toml::Value::Table(tb) = root {
        *t = tb;
    }
    r
}

/// Run the shard's points on `threads` threads; `progress(done, total)`.
pub fn run_plan(
    plan: &Plan,
    shard: Shard,
    threads: usize,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Result<SweepResult, SimError> {
    let jobs: Vec<(usize, u64)> = (0..plan.points())
        .flat_map(|p| plan.seeds.iter().map(move |&s| (p, s)))
        .enumerate()
        .filter(|(i, _)| i % shard.count == shard.index)
        .map(|(_, j)| j)
        .collect();
    let next = AtomicUsize::new(0);
    let rows = Mutex::new(Vec::with_capacity(jobs.len()));
    let progress = Mutex::new(progress);
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()).max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(p, seed)) = jobs.get(i) else { break };
                    let row = run_point(plan, p, seed);
                    let mut r = rows.lock().expect("rows");
                    r.push((i, row));
                    let done = r.len();
                    drop(r);
                    (progress.lock().expect("progress"))(done, jobs.len());
                }
            });
        }
    });
    let mut rows = rows.into_inner().expect("rows");
    rows.sort_by_key(|(i, _)| *i);
    Ok(SweepResult {
        rows: rows.into_iter().map(|(_, r)| r).collect(),
    })
}

fn run_point(plan: &Plan, p: usize, seed: u64) -> Row {
    let params: Vec<(String, String)> = plan
        .params(p)
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    let mut row = Row {
        point: p,
        params,
        seed,
        finished: false,
        makespan_us: 0.0,
        fct_p50_us: 0.0,
        fct_p99_us: 0.0,
        goodput_gbps: 0.0,
        busbw_gbs: 0.0,
        drops: 0,
        retransmissions: 0,
        error: None,
    };
    let out = plan
        .scenario(p)
        .and_then(|s| crate::run_scenario(&s, Some(seed), &mut |_, _, _, _| {}));
    match out {
        Ok(o) => {
            let r = &o.results;
            row.finished = r.finished;
            row.makespan_us = r.makespan_us;
            row.fct_p50_us = r.fct.p50_us;
            row.fct_p99_us = r.fct.p99_us;
            row.goodput_gbps = r.goodput_gbps;
            row.busbw_gbs = r.collectives.first().map_or(0.0, |c| c.busbw_gbs);
            row.drops = r.fabric.drops;
            row.retransmissions = r.transport_stats.retransmissions;
        }
        Err(e) => row.error = Some(e.to_string()),
    }
    row
}

impl SweepResult {
    /// CSV with one column per parameter.
    pub fn csv(&self) -> String {
        let mut s = String::from("point");
        if let Some(r) = self.rows.first() {
            for (k, _) in &r.params {
                let _ = write!(s, ",{k}");
            }
        }
        s.push_str(",seed,finished,makespan_us,fct_p50_us,fct_p99_us,goodput_gbps,busbw_gbs,drops,retransmissions,error\n");
        for r in &self.rows {
            let _ = write!(s, "{}", r.point);
            for (_, v) in &r.params {
                let _ = write!(s, ",{}", v.replace(',', ";"));
            }
            let _ = writeln!(
                s,
                ",{},{},{},{},{},{},{},{},{},{}",
                r.seed,
                r.finished,
                r.makespan_us,
                r.fct_p50_us,
                r.fct_p99_us,
                r.goodput_gbps,
                r.busbw_gbs,
                r.drops,
                r.retransmissions,
                r.error.as_deref().unwrap_or("").replace(',', ";")
            );
        }
        s
    }

    /// Terminal table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:>5} {:<40} {:>5} {:>12} {:>10} {:>10} {:>9} {:>8}\n",
            "point", "params", "seed", "makespan(us)", "p50(us)", "p99(us)", "Gb/s", "busbw"
        );
        for r in &self.rows {
            let p: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                s,
                "{:>5} {:<40} {:>5} {:>12.2} {:>10.2} {:>10.2} {:>9.1} {:>8.2}{}",
                r.point,
                p.join(" "),
                r.seed,
                r.makespan_us,
                r.fct_p50_us,
                r.fct_p99_us,
                r.goodput_gbps,
                r.busbw_gbs,
                r.error
                    .as_deref()
                    .map_or(String::new(), |e| format!("  ERROR {e}"))
            );
        }
        s
    }

    /// Write `sweep[-i-of-n].json`, `.csv` and `.svg` (makespan and FCT
    /// against the plan's swept parameter, see [`crate::plot::sweep_svg`])
    /// into `dir`.
    pub fn write_to(&self, plan: &Plan, dir: &Path, shard: Shard) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let stem = if shard.count == 1 {
            "sweep".to_string()
        } else {
            format!("sweep-{}-of-{}", shard.index, shard.count)
        };
        std::fs::write(
            dir.join(format!("{stem}.json")),
            serde_json::to_string_pretty(self).expect("rows") + "\n",
        )?;
        std::fs::write(dir.join(format!("{stem}.csv")), self.csv())?;
        std::fs::write(
            dir.join(format!("{stem}.svg")),
            crate::plot::sweep_svg(&self.rows, plan.x_axis.as_deref(), &plan.describe())?,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_set_nested_values() {
        let mut t: toml::Table = "[a]\nb = 1\n[[w]]\nx = 2\n".parse().unwrap();
        set_dotted(&mut t, "a.b", toml::Value::Integer(5)).unwrap();
        set_dotted(&mut t, "w.0.x", toml::Value::Integer(7)).unwrap();
        assert_eq!(t["a"]["b"].as_integer(), Some(5));
        assert_eq!(t["w"][0]["x"].as_integer(), Some(7));
        assert!(set_dotted(&mut t, "w.3.x", toml::Value::Integer(1)).is_err());
    }

    #[test]
    fn shards_parse() {
        assert_eq!(Shard::parse("2/8"), Ok(Shard { index: 2, count: 8 }));
        assert!(Shard::parse("8/8").is_err());
    }
}
