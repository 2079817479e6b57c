//! nccl-tests' output, so that its parsers read ours.
//!
//! The layout follows nccl-tests 2.19 (`src/util.cu`, `src/common.cu` and
//! the per-collective `src/*.cu`): a `#` header block naming the run's
//! parameters and devices, a three-line column header, one row per size
//! with an out-of-place and an in-place measurement, and a footer with the
//! count of failed measurements and the average bus bandwidth.
//!
//! ```text
//! #       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
//! #        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
//!      1048576        262144     float     sum      -1    95.12   11.02   20.67       0    94.80   11.06   20.74       0
//! ```
//!
//! Numbers are printed the way nccl-tests' C `printf` calls print them:
//! times in a 7-wide and bandwidths in a 6-wide field with 2, 1 or 0
//! decimals, whichever fits (then exponent notation), `#wrong` and the
//! average with `%g`.
//!
//! Bandwidths: `algbw = S / t` with `S` the size column (bytes) in GB/s
//! (10^9 bytes per second), and `busbw = algbw × factor`, the factor
//! making busbw comparable with link speed whatever the rank count
//! ([`PerfCollective::bus_bw_factor`]).

pub mod options;

pub use options::{OptionsError, PerfOptions, USAGE, parse_perf_args};

use std::fmt::Write as _;
use std::str::FromStr;

use crate::datatype::{DataType, ReduceOp};

/// The nccl-tests version whose output layout this module reproduces.
pub const NCCL_TESTS_FORMAT_VERSION: &str = "2.19.6";

/// The collectives nccl-tests measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PerfCollective {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `alltoall_perf`.
    AllToAll,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `sendrecv_perf`: every rank sends to the next and receives from the previous.
    SendRecv,
}

/// A collective name nccl-tests does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown collective {0:?} (expected all_reduce, all_gather, reduce_scatter, alltoall, broadcast, reduce or sendrecv, optionally with _perf)"
)]
pub struct UnknownCollective(pub String);

impl FromStr for PerfCollective {
    type Err = UnknownCollective;

    /// Accepts `all_reduce` and nccl-tests' program name `all_reduce_perf`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let base = s.strip_suffix("_perf").unwrap_or(s);
        Ok(match base {
            "all_reduce" => Self::AllReduce,
            "all_gather" => Self::AllGather,
            "reduce_scatter" => Self::ReduceScatter,
            "alltoall" => Self::AllToAll,
            "broadcast" => Self::Broadcast,
            "reduce" => Self::Reduce,
            "sendrecv" => Self::SendRecv,
            _ => return Err(UnknownCollective(s.to_owned())),
        })
    }
}

/// Element counts of one measurement, as nccl-tests sizes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollCounts {
    /// Elements in each rank's send buffer.
    pub send_count: u64,
    /// Elements in each rank's receive buffer.
    pub recv_count: u64,
    /// The `count` argument of the collective call (the `count` column).
    pub param_count: u64,
    /// In place, where rank `r`'s input starts in the buffer: `r ×` this.
    pub send_in_place_offset: u64,
    /// In place, where rank `r`'s output starts in the buffer: `r ×` this.
    pub recv_in_place_offset: u64,
}

impl CollCounts {
    /// The `size` column: the larger buffer, in bytes.
    pub fn size_bytes(&self, dtype: DataType) -> u64 {
        self.send_count.max(self.recv_count) * dtype.size_bytes() as u64
    }
}

impl PerfCollective {
    /// Every collective, in the order nccl-tests' README lists them.
    pub const ALL: [Self; 7] = [
        Self::AllReduce,
        Self::AllGather,
        Self::ReduceScatter,
        Self::AllToAll,
        Self::Broadcast,
        Self::Reduce,
        Self::SendRecv,
    ];

    /// The collective's short name (`all_reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllToAll => "alltoall",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' program name (`all_reduce_perf`), printed in the header and footer.
    pub fn program_name(self) -> String {
        format!("{}_perf", self.name())
    }

    /// True when the `redop` column names the operator (and `-o all` runs
    /// every operator); the others print `none`. nccl-tests' sendrecv loops
    /// over operators too although it reduces nothing.
    pub const fn has_redop(self) -> bool {
        matches!(
            self,
            Self::AllReduce | Self::ReduceScatter | Self::Reduce | Self::SendRecv
        )
    }

    /// True when the collective has a root (the others print `-1`).
    pub const fn has_root(self) -> bool {
        matches!(self, Self::Broadcast | Self::Reduce)
    }

    /// busbw / algbw: the fraction of the data each rank's link carries
    /// relative to the buffer. all_reduce `2(n-1)/n` (reduce-scatter then
    /// all-gather); all_gather, reduce_scatter and alltoall `(n-1)/n`;
    /// broadcast, reduce and sendrecv 1.
    pub fn bus_bw_factor(self, world: u32) -> f64 {
        let n = f64::from(world.max(1));
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::AllGather | Self::ReduceScatter | Self::AllToAll => (n - 1.0) / n,
            Self::Broadcast | Self::Reduce | Self::SendRecv => 1.0,
        }
    }

    /// nccl-tests' buffer counts for a requested size of `bytes`: the
    /// per-rank blocks of all_gather, reduce_scatter and alltoall are
    /// `(bytes/elem)/world` elements rounded down to a multiple of 16 bytes.
    pub fn counts(self, bytes: u64, dtype: DataType, world: u32) -> CollCounts {
        let elem = dtype.size_bytes() as u64;
        let count = bytes / elem;
        let n = u64::from(world.max(1));
        let per_rank = (count / n) & !(16 / elem - 1);
        match self {
            Self::AllReduce | Self::Broadcast | Self::Reduce | Self::SendRecv => CollCounts {
                send_count: count,
                recv_count: count,
                param_count: count,
                send_in_place_offset: 0,
                recv_in_place_offset: 0,
            },
            Self::AllGather => CollCounts {
                send_count: per_rank,
                recv_count: per_rank * n,
                param_count: per_rank,
                send_in_place_offset: per_rank,
                recv_in_place_offset: 0,
            },
            Self::ReduceScatter => CollCounts {
                send_count: per_rank * n,
                recv_count: per_rank,
                param_count: per_rank,
                send_in_place_offset: 0,
                recv_in_place_offset: per_rank,
            },
            Self::AllToAll => CollCounts {
                send_count: per_rank * n,
                recv_count: per_rank * n,
                param_count: per_rank,
                send_in_place_offset: 0,
                recv_in_place_offset: 0,
            },
        }
    }

    /// `(algbw, busbw)` in GB/s for `size_bytes` (the size column) moved in `seconds`.
    pub fn bandwidths(self, size_bytes: u64, seconds: f64, world: u32) -> (f64, f64) {
        let alg = size_bytes as f64 / 1.0e9 / seconds;
        (alg, alg * self.bus_bw_factor(world))
    }
}

/// One timed run (out-of-place or in-place) of one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// Average time per iteration, microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub alg_bw: f64,
    /// Bus bandwidth, GB/s.
    pub bus_bw: f64,
    /// Wrong elements over all ranks; `None` when not checked (`-c 0`, printed `N/A`).
    pub wrong: Option<u64>,
}

/// One line of the results table.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultRow {
    /// The `size` column, bytes.
    pub size_bytes: u64,
    /// The `count` column, elements.
    pub count: u64,
    /// The `type` column (NCCL's name).
    pub type_name: String,
    /// The `redop` column (`none` for collectives without one).
    pub redop: String,
    /// The `root` column (`-1` for collectives without one).
    pub root: i64,
    /// Out-of-place measurement.
    pub out_of_place: Measurement,
    /// In-place measurement.
    pub in_place: Measurement,
}

impl ResultRow {
    /// A row's label columns for a collective.
    pub fn labels(
        collective: PerfCollective,
        dtype: DataType,
        op: ReduceOp,
        root: u32,
    ) -> (String, String, i64) {
        (
            dtype.nccl_name().to_owned(),
            if collective.has_redop() {
                op.nccl_name().to_owned()
            } else {
                "none".to_owned()
            },
            if collective.has_root() {
                i64::from(root)
            } else {
                -1
            },
        )
    }
}

/// One `#  Rank ...` line of the header's device list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLine {
    /// Rank.
    pub rank: u32,
    /// Communicator split group (0).
    pub group: u32,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub hostname: String,
    /// Local device index.
    pub device: u32,
    /// PCI domain, bus, device (zeros when there is no such device).
    pub pci: (u16, u8, u8),
    /// Device description.
    pub name: String,
}

/// The parameters the header block reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunHeader {
    /// Program name (`all_reduce_perf`).
    pub program: String,
    /// Who wrote the output (goes after the format version on the first line).
    pub writer: String,
    /// `-b`.
    pub min_bytes: u64,
    /// `-e`.
    pub max_bytes: u64,
    /// `-f` when above 1, else `-i`: printed as `step: N(factor)` or `step: N(bytes)`.
    pub step_factor: u64,
    /// `-i`.
    pub step_bytes: u64,
    /// `-w`.
    pub warmup_iters: u32,
    /// `-n`.
    pub iters: u32,
    /// `-m`.
    pub agg_iters: u32,
    /// `-c`.
    pub validation: u32,
    /// `-z`.
    pub blocking: u32,
    /// Devices, one line each.
    pub devices: Vec<DeviceLine>,
}

/// The header block up to and including the device list.
pub fn format_header(h: &RunHeader) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# nccl-tests version {NCCL_TESTS_FORMAT_VERSION} format, written by {}",
        h.writer
    );
    let _ = writeln!(s, "# Collective test starting: {}", h.program);
    let (step, unit) = if h.step_factor > 1 {
        (h.step_factor, "factor")
    } else {
        (h.step_bytes, "bytes")
    };
    let _ = writeln!(
        s,
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {step}({unit}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: 0",
        h.min_bytes, h.max_bytes, h.warmup_iters, h.iters, h.agg_iters, h.validation
    );
    match h.blocking {
        1 => s.push_str("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"),
        2 => s.push_str("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n"),
        3 => s.push_str(
            "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n",
        ),
        _ => {}
    }
    s.push_str("#\n# Using devices\n");
    for d in &h.devices {
        let _ = writeln!(
            s,
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{:04x}:{:02x}:{:02x}] {}",
            d.rank, d.group, d.pid, d.hostname, d.device, d.pci.0, d.pci.1, d.pci.2, d.name
        );
    }
    s
}

/// The column header: a `#` line, the out-of-place / in-place banner, the
/// names and the units (trailing spaces as nccl-tests prints them).
pub fn format_table_header() -> String {
    let mut s = String::from("#\n");
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    s
}

fn format_measurement(s: &mut String, m: &Measurement) {
    let t = c_float(m.time_us, 7);
    let a = c_float(m.alg_bw, 6);
    let b = c_float(m.bus_bw, 6);
    match m.wrong {
        Some(w) => {
            let _ = write!(s, "  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64));
        }
        None => {
            let _ = write!(s, "  {t:>7}  {a:>6}  {b:>6}    N/A");
        }
    }
}

/// One results line, newline included.
pub fn format_row(r: &ResultRow) -> String {
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        r.size_bytes, r.count, r.type_name, r.redop, r.root
    );
    format_measurement(&mut s, &r.out_of_place);
    format_measurement(&mut s, &r.in_place);
    s.push('\n');
    s
}

/// nccl-tests' `Out of bounds values`: measurements (out-of-place and
/// in-place counted separately) with at least one wrong element.
pub fn out_of_bounds(rows: &[ResultRow]) -> u64 {
    rows.iter()
        .flat_map(|r| [r.out_of_place, r.in_place])
        .filter(|m| m.wrong.is_some_and(|w| w > 0))
        .count() as u64
}

/// nccl-tests' `Avg bus bandwidth`: the mean busbw over every measurement,
/// out-of-place and in-place alike (NaN without rows, as in nccl-tests).
pub fn average_bus_bw(rows: &[ResultRow]) -> f64 {
    let sum: f64 = rows
        .iter()
        .map(|r| r.out_of_place.bus_bw + r.in_place.bus_bw)
        .sum();
    sum / (2 * rows.len()) as f64
}

/// The footer: failed measurements, average bus bandwidth (checked against
/// `min_bw` the way `NCCL_TESTS_MIN_BW` is: FAILED below 90 % of it), the
/// closing lines, and an error line or an empty line.
pub fn format_footer(
    out_of_bounds: u64,
    avg_bus_bw: f64,
    min_bw: Option<f64>,
    program: &str,
    error: Option<&str>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {:<20} : {} {}",
        "Out of bounds values",
        out_of_bounds,
        if out_of_bounds > 0 { "FAILED" } else { "OK" }
    );
    let verdict = match min_bw {
        None => "",
        Some(min) if avg_bus_bw < min * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    let _ = writeln!(
        s,
        "# {:<20} : {} {verdict}",
        "Avg bus bandwidth",
        c_g(avg_bus_bw)
    );
    s.push_str("#\n");
    let _ = writeln!(s, "# Collective test concluded: {program}");
    s.push_str("#\n");
    match error {
        Some(e) if !e.is_empty() => {
            let _ = writeln!(s, "# error: {e}");
        }
        _ => s.push('\n'),
    }
    s
}

/// C's `%.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
fn c_exp(value: f64, prec: usize) -> String {
    if !value.is_finite() {
        return c_special(value);
    }
    let r = format!("{value:.prec$e}");
    let (mantissa, exp) = r.split_once('e').expect("exponent notation");
    let exp: i32 = exp.parse().expect("integer exponent");
    format!(
        "{mantissa}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.abs()
    )
}

fn c_special(value: f64) -> String {
    if value.is_nan() {
        if value.is_sign_negative() {
            "-nan".into()
        } else {
            "nan".into()
        }
    } else if value > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// nccl-tests' `getFloatStr`: `value` with 2, 1 or 0 decimals, the first
/// that fits `width` characters, else exponent notation (1 decimal when
/// `width` ≥ 7), right-aligned in `width`. The exponent fallback is cut to
/// `width` characters like nccl-tests' `snprintf` into a `width+1` buffer.
pub fn c_float(value: f64, width: usize) -> String {
    if value.is_finite() {
        for prec in [2usize, 1, 0] {
            let s = format!("{value:>width$.prec$}");
            if s.len() <= width {
                return s;
            }
        }
    }
    let e = c_exp(value, if width >= 7 { 1 } else { 0 });
    let s = format!("{e:>width$}");
    s.chars().take(width).collect()
}

/// C's `%g` (precision 6): the shorter of fixed and exponent notation, no
/// trailing zeros.
pub fn c_g(value: f64) -> String {
    const P: i32 = 6;
    if !value.is_finite() {
        return c_special(value);
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // The exponent after rounding to P significant digits decides the form.
    let e = format!("{value:.*e}", (P - 1) as usize);
    let (_, exp) = e.split_once('e').expect("exponent notation");
    let x: i32 = exp.parse().expect("integer exponent");
    let strip = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    if (-4..P).contains(&x) {
        strip(format!("{value:.*}", (P - 1 - x) as usize))
    } else {
        let s = c_exp(value, (P - 1) as usize);
        let (mantissa, exp) = s.split_once('e').expect("exponent notation");
        format!("{}e{exp}", strip(mantissa.to_owned()))
    }
}

#[cfg(test)]
mod tests;
