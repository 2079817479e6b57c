//! nccl-tests' command-line options, their meanings and defaults.
//!
//! | option | long form | meaning | default |
//! | --- | --- | --- | --- |
//! | `-b` | `--minbytes` | smallest size | 32M |
//! | `-e` | `--maxbytes` | largest size | 32M |
//! | `-i` | `--stepbytes` | size increment (when no factor) | 1M |
//! | `-f` | `--stepfactor` | size multiplier (> 1 replaces `-i`) | 1 (off) |
//! | `-n` | `--iters` | timed iterations per size | 20 |
//! | `-w` | `--warmup_iters` | untimed iterations per size | 1 |
//! | `-m` | `--agg_iters` | operations aggregated per iteration | 1 |
//! | `-c` | `--check` | verified runs per measurement (0: no check, `#wrong` N/A) | 1 |
//! | `-o` | `--op` | `sum`, `prod`, `max`, `min`, `avg` or `all` | sum |
//! | `-d` | `--datatype` | an NCCL type name or `all` | float |
//! | `-r` | `--root` | root rank, or `all` (or -1) for every rank | 0 |
//! | `-z` | `--blocking` | 0 async, 1 wait+barrier per op, 2 wait per op, 3 wait+barrier per iteration | 0 |
//! | `-a` | `--average` | time reported: 0 rank 0's, 1 mean, 2 min, 3 max over ranks | 1 |
//! | `-h` | `--help` | usage | |
//!
//! Sizes take nccl-tests' binary suffixes (`K`, `M`, `G`, either case,
//! powers of 1024, fractions allowed: `1.5M`); integers take C's `strtol`
//! bases (`0x10`, `010`, `16`). Unlike nccl-tests, which falls back to a
//! default with a message or silently reads garbage as 0, a malformed value,
//! an unknown name or an unknown option is an error here, and so is a size
//! sequence that would never end (`-b 0 -f 2`, or `-i 0` without a factor).

use std::fmt;

use crate::datatype::{DataType, ReduceOp};

/// Parsed options of one `coll-perf` run.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfOptions {
    /// `-b`: smallest size in bytes.
    pub min_bytes: u64,
    /// `-e`: largest size in bytes.
    pub max_bytes: u64,
    /// `-i`: additive step when `step_factor` ≤ 1.
    pub step_bytes: u64,
    /// `-f`: multiplicative step; ≤ 1 means additive steps.
    pub step_factor: u64,
    /// `-n`: timed iterations.
    pub iters: u32,
    /// `-w`: warm-up iterations.
    pub warmup_iters: u32,
    /// `-m`: operations per iteration.
    pub agg_iters: u32,
    /// `-c`: verified runs per measurement.
    pub check: u32,
    /// `-o`: `None` for `all`.
    pub op: Option<ReduceOp>,
    /// `-d`: `None` for `all`.
    pub dtype: Option<DataType>,
    /// `-r`: `None` for every rank in turn.
    pub root: Option<u32>,
    /// `-z`: blocking mode 0-3.
    pub blocking: u32,
    /// `-a`: reported time 0-3.
    pub average: u32,
    /// `-R`: buffer registration, 0-2. Every buffer of a MetaRoCE
    /// collective is a registered region already, so 0 and 1 (local
    /// registration) are the same; 2 makes the receive buffers symmetric
    /// (`OpSpec::symmetric`: peers write straight into them).
    pub register: u32,
}

impl Default for PerfOptions {
    fn default() -> Self {
        Self {
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            warmup_iters: 1,
            agg_iters: 1,
            check: 1,
            op: Some(ReduceOp::Sum),
            dtype: Some(DataType::Float32),
            root: Some(0),
            blocking: 0,
            average: 1,
            register: 0,
        }
    }
}

/// Why the arguments were not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// `-h` / `--help`: print [`USAGE`] and stop.
    #[error("help requested")]
    Help,
    /// An option nobody knows.
    #[error("unknown option {0:?}")]
    Unknown(String),
    /// An option without its value.
    #[error("option {0} needs a value")]
    MissingValue(String),
    /// A value that does not parse or is out of range.
    #[error("invalid value {value:?} for {option}: {why}")]
    BadValue {
        /// The option.
        option: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// Options that contradict each other.
    #[error("{0}")]
    Inconsistent(String),
}

/// Usage text for the options.
pub const USAGE: &str = "\
  -b, --minbytes <size>       smallest size (default 32M; K/M/G suffixes)
  -e, --maxbytes <size>       largest size (default 32M)
  -i, --stepbytes <size>      increment between sizes (default 1M)
  -f, --stepfactor <n>        multiply sizes by n instead (default 1: off)
  -n, --iters <n>             timed iterations (default 20)
  -w, --warmup_iters <n>      warm-up iterations (default 1)
  -m, --agg_iters <n>         operations per iteration (default 1)
  -c, --check <n>             verified runs per size, 0 to skip (default 1)
  -o, --op <op>               sum, prod, max, min, avg or all (default sum)
  -d, --datatype <type>       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 or all (default float)
  -r, --root <rank>           root rank or all (default 0)
  -z, --blocking <0-3>        0 async, 1 wait and barrier after each op, 2 wait after each op, 3 wait and barrier after each iteration (default 0)
  -a, --average <0-3>         report rank 0's (0), mean (1), min (2) or max (3) time (default 1)
  -R, --local_register <0-2>  buffer registration: 0 or 1 local (every buffer is registered), 2 symmetric
                              receive buffers, written straight into by the peers (default 0)
  -h, --help                  this text
";

/// Which option a name means, and the canonical short name.
fn option_of(name: &str) -> Option<char> {
    Some(match name {
        "-b" | "--minbytes" => 'b',
        "-e" | "--maxbytes" => 'e',
        "-i" | "--stepbytes" => 'i',
        "-f" | "--stepfactor" => 'f',
        "-n" | "--iters" => 'n',
        "-w" | "--warmup_iters" => 'w',
        "-m" | "--agg_iters" => 'm',
        "-c" | "--check" => 'c',
        "-o" | "--op" => 'o',
        "-d" | "--datatype" => 'd',
        "-r" | "--root" => 'r',
        "-z" | "--blocking" => 'z',
        "-a" | "--average" => 'a',
        "-R" | "--local_register" => 'R',
        "-h" | "--help" => 'h',
        _ => return None,
    })
}

fn bad(option: char, value: &str, why: impl fmt::Display) -> OptionsError {
    OptionsError::BadValue {
        option: format!("-{option}"),
        value: value.to_owned(),
        why: why.to_string(),
    }
}

/// nccl-tests' `parsesize`: a number, optionally fractional (or
/// hexadecimal), and an optional K, M or G (binary) suffix.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&t[..i], Some(c.to_ascii_uppercase())),
        _ => (t, None),
    };
    let mult = match unit {
        None => 1.0,
        Some('K') => 1024.0,
        Some('M') => 1024.0 * 1024.0,
        Some('G') => 1024.0 * 1024.0 * 1024.0,
        Some(_) => return None,
    };
    let num = num.trim_end();
    // C's strtod also reads hexadecimal.
    let v: f64 = match num.strip_prefix("0x").or_else(|| num.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok()? as f64,
        None => num.parse().ok()?,
    };
    let bytes = v * mult;
    if !(0.0..18_446_744_073_709_551_616.0).contains(&bytes) {
        return None;
    }
    Some(bytes as u64)
}

/// C's `strtol(s, NULL, 0)` on the whole string: optional sign, then hex
/// (`0x`), octal (leading `0`) or decimal.
pub fn parse_c_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, t) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn parse_u32(option: char, value: &str, max: u32) -> Result<u32, OptionsError> {
    match parse_c_int(value) {
        Some(v) if (0..=i64::from(max)).contains(&v) => Ok(v as u32),
        Some(_) => Err(bad(option, value, format!("must be 0..={max}"))),
        None => Err(bad(option, value, "not an integer")),
    }
}

/// Parses nccl-tests options (without the program name or the collective).
pub fn parse_perf_args<I, S>(args: I) -> Result<PerfOptions, OptionsError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut o = PerfOptions::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let arg = arg.as_ref();
        // `--name=value`, `--name value`, `-xVALUE`, `-x VALUE`.
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v.to_owned())),
                None => (arg.to_owned(), None),
            }
        } else if arg.starts_with('-')
            && arg.len() > 2
            && !arg[1..].starts_with(|c: char| c.is_ascii_digit())
        {
            (arg[..2].to_owned(), Some(arg[2..].to_owned()))
        } else {
            (arg.to_owned(), None)
        };
        let Some(opt) = option_of(&name) else {
            return Err(OptionsError::Unknown(arg.to_owned()));
        };
        if opt == 'h' {
            return Err(OptionsError::Help);
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .map(|v| v.as_ref().to_owned())
                .ok_or_else(|| OptionsError::MissingValue(name.clone()))?,
        };
        let v = value.as_str();
        let size = || {
            parse_size(v)
                .ok_or_else(|| bad(opt, v, "not a size (a number with an optional K, M or G)"))
        };
        match opt {
            'b' => o.min_bytes = size()?,
            'e' => o.max_bytes = size()?,
            'i' => o.step_bytes = size()?,
            'f' => o.step_factor = u64::from(parse_u32(opt, v, u32::MAX)?),
            'n' => o.iters = parse_u32(opt, v, u32::MAX)?,
            'w' => o.warmup_iters = parse_u32(opt, v, u32::MAX)?,
            'm' => o.agg_iters = parse_u32(opt, v, u32::MAX)?.max(1),
            'c' => o.check = parse_u32(opt, v, u32::MAX)?,
            'o' => {
                o.op = if v == "all" {
                    None
                } else {
                    Some(v.parse().map_err(|e| bad(opt, v, e))?)
                }
            }
            'd' => {
                o.dtype = if v == "all" {
                    None
                } else {
                    Some(v.parse().map_err(|e| bad(opt, v, e))?)
                }
            }
            'r' => {
                o.root = match v {
                    "all" | "-1" => None,
                    _ => Some(parse_u32(opt, v, u32::MAX)?),
                }
            }
            'z' => o.blocking = parse_u32(opt, v, 3)?,
            'a' => o.average = parse_u32(opt, v, 3)?,
            'R' => o.register = parse_u32(opt, v, 2)?,
            _ => unreachable!("option_of returns only the letters above"),
        }
    }
    if o.min_bytes > o.max_bytes {
        return Err(OptionsError::Inconsistent(format!(
            "minbytes {} exceeds maxbytes {}",
            o.min_bytes, o.max_bytes
        )));
    }
    if o.min_bytes < o.max_bytes {
        if o.step_factor > 1 && o.min_bytes == 0 {
            return Err(OptionsError::Inconsistent(
                "a step factor from minbytes 0 never grows: give -b > 0".into(),
            ));
        }
        if o.step_factor <= 1 && o.step_bytes == 0 {
            return Err(OptionsError::Inconsistent(
                "stepbytes 0 without a step factor never grows".into(),
            ));
        }
    }
    Ok(o)
}

impl PerfOptions {
    /// The sizes measured, in bytes: from `min_bytes` up to `max_bytes`,
    /// multiplied by `step_factor` when it is above 1, else increased by
    /// `step_bytes`.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            out.push(size);
            let next = if self.step_factor > 1 {
                size.checked_mul(self.step_factor)
            } else {
                size.checked_add(self.step_bytes)
            };
            match next {
                Some(n) if n > size => size = n,
                _ => break,
            }
        }
        out
    }

    /// The operators to run, in nccl-tests' order for `all`.
    pub fn ops(&self) -> Vec<ReduceOp> {
        self.op.map_or_else(|| ReduceOp::ALL.to_vec(), |o| vec![o])
    }

    /// The types to run, in nccl-tests' order for `all`.
    pub fn dtypes(&self) -> Vec<DataType> {
        self.dtype
            .map_or_else(|| DataType::ALL.to_vec(), |d| vec![d])
    }

    /// The roots to run in a world of `world` ranks.
    pub fn roots(&self, world: u32) -> Vec<u32> {
        self.root.map_or_else(|| (0..world).collect(), |r| vec![r])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_nccl_tests_defaults() {
        let o = parse_perf_args(Vec::<String>::new()).unwrap();
        assert_eq!(o, PerfOptions::default());
        assert_eq!(o.sizes(), [32 << 20]);
        assert_eq!(
            (o.iters, o.warmup_iters, o.check, o.average, o.blocking),
            (20, 1, 1, 1, 0)
        );
    }

    #[test]
    fn the_readme_example() {
        let o = parse_perf_args(["-b", "8", "-e", "128M", "-f", "2"]).unwrap();
        let sizes = o.sizes();
        assert_eq!(sizes.first(), Some(&8));
        assert_eq!(sizes.last(), Some(&(128 << 20)));
        assert_eq!(sizes.len(), 25);
    }

    #[test]
    fn forms_and_values() {
        let o = parse_perf_args([
            "-b1K",
            "--maxbytes=1.5M",
            "-i",
            "0x1000",
            "-n",
            "010",
            "--warmup_iters",
            "3",
            "-c0",
            "-o",
            "all",
            "-d",
            "bfloat16",
            "-r",
            "all",
            "-z",
            "3",
            "-a",
            "2",
            "-m",
            "4",
            "-R",
            "2",
        ])
        .unwrap();
        assert_eq!(
            (o.min_bytes, o.max_bytes, o.step_bytes),
            (1024, 1536 * 1024, 4096)
        );
        assert_eq!(
            (o.iters, o.warmup_iters, o.check, o.agg_iters),
            (8, 3, 0, 4)
        );
        assert_eq!(
            (o.op, o.dtype, o.root, o.blocking, o.average, o.register),
            (None, Some(DataType::Bfloat16), None, 3, 2, 2)
        );
        assert!(parse_perf_args(["-R", "3"]).is_err());
        assert_eq!(o.ops().len(), 5);
        assert_eq!(o.dtypes(), [DataType::Bfloat16]);
        assert_eq!(
            PerfOptions {
                dtype: None,
                ..o.clone()
            }
            .dtypes()
            .len(),
            10
        );
        assert_eq!(o.roots(3), [0, 1, 2]);
        let additive = parse_perf_args(["-b", "1M", "-e", "3M"]).unwrap();
        assert_eq!(additive.sizes(), [1 << 20, 2 << 20, 3 << 20]);
        assert_eq!(parse_perf_args(["-r", "-1"]).unwrap().root, None);
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("0.5k"), Some(512));
        assert_eq!(parse_c_int("-12"), Some(-12));
    }

    #[test]
    fn errors_are_clear() {
        assert_eq!(parse_perf_args(["-h"]), Err(OptionsError::Help));
        assert!(matches!(
            parse_perf_args(["-t", "2"]),
            Err(OptionsError::Unknown(_))
        ));
        assert!(matches!(
            parse_perf_args(["-n"]),
            Err(OptionsError::MissingValue(_))
        ));
        assert!(matches!(
            parse_perf_args(["-b", "8X"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-n", "ten"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-d", "float8"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-o", "mulsum"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-z", "4"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-b", "-5"]),
            Err(OptionsError::BadValue { .. })
        ));
        assert!(matches!(
            parse_perf_args(["-b", "2M", "-e", "1M"]),
            Err(OptionsError::Inconsistent(_))
        ));
        assert!(matches!(
            parse_perf_args(["-b", "0", "-e", "1M", "-f", "2"]),
            Err(OptionsError::Inconsistent(_))
        ));
        assert!(matches!(
            parse_perf_args(["-b", "0", "-e", "1M", "-i", "0"]),
            Err(OptionsError::Inconsistent(_))
        ));
        assert!(matches!(
            parse_perf_args(["all_reduce"]),
            Err(OptionsError::Unknown(_))
        ));
    }
}
