//! Host sets: which hosts a workload runs on.
//!
//! A scenario names them under a workload's `hosts` key, either as one
//! string or as a list whose items are host indices or strings:
//!
//! | form | hosts |
//! |---|---|
//! | `"all"` | every host, in index order |
//! | `"8"` or `8` | host 8 |
//! | `"0-127"` | hosts 0 to 127 inclusive |
//! | `"0-1023:8"` | every 8th host from 0 to 1023 (0, 8, 16, ...) |
//! | `"0-15,64-79"` | both ranges, in that order |
//! | `"random:64"` | 64 distinct hosts drawn with the scenario seed |
//! | `"random:64@0-511"` | 64 drawn from hosts 0-511 |
//!
//! Order matters where a workload has one (a ring all-reduce walks its
//! hosts in set order). A host named twice, an index beyond the topology,
//! or a draw larger than its pool is an error naming the item.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A workload's `hosts` value as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum HostSetConf {
    /// One string spec (`"0-63"`, `"random:32"`, ...).
    Spec(String),
    /// A list of indices and spec strings.
    List(Vec<HostItem>),
}

/// One item of a host list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum HostItem {
    /// A host index.
    Index(u32),
    /// A spec string.
    Spec(String),
}

impl HostSetConf {
    /// The hosts, in order, out of a topology of `hosts`; random draws use
    /// `seed`. The error names the offending item.
    pub fn resolve(&self, hosts: u32, seed: u64) -> Result<Vec<u32>, String> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4057_5e75);
        let mut out = Vec::new();
        match self {
            Self::Spec(s) => {
                for part in s.split(',') {
                    resolve_part(part.trim(), hosts, &mut rng, &mut out)?;
                }
            }
            Self::List(items) => {
                for item in items {
                    match item {
                        HostItem::Index(i) => resolve_index(*i, hosts, &mut out)?,
                        HostItem::Spec(s) => resolve_part(s.trim(), hosts, &mut rng, &mut out)?,
                    }
                }
            }
        }
        let mut seen = vec![false; hosts as usize];
        for &h in &out {
            if std::mem::replace(&mut seen[h as usize], true) {
                return Err(format!("host {h} is named twice"));
            }
        }
        Ok(out)
    }
}

fn resolve_index(i: u32, hosts: u32, out: &mut Vec<u32>) -> Result<(), String> {
    if i >= hosts {
        return Err(format!(
            "host {i} is beyond the topology's {hosts} hosts (0-{})",
            hosts - 1
        ));
    }
    out.push(i);
    Ok(())
}

fn number(s: &str, what: &str) -> Result<u32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a {what} (expected a non-negative integer)"))
}

/// `A-B` or `A-B:S` as the hosts it names (checked against `hosts`).
fn range(s: &str, hosts: u32) -> Result<Vec<u32>, String> {
    let (span, stride) = match s.split_once(':') {
        Some((span, stride)) => (span, number(stride, "stride")?),
        None => (s, 1),
    };
    if stride == 0 {
        return Err(format!("'{s}': stride must be at least 1"));
    }
    let (a, b) = span
        .split_once('-')
        .ok_or_else(|| format!("'{s}' is not a range (expected A-B or A-B:STRIDE)"))?;
    let (a, b) = (number(a, "host index")?, number(b, "host index")?);
    if a > b {
        return Err(format!("'{s}': range runs backwards"));
    }
    if b >= hosts {
        return Err(format!(
            "'{s}': host {b} is beyond the topology's {hosts} hosts (0-{})",
            hosts - 1
        ));
    }
    Ok((a..=b).step_by(stride as usize).collect())
}

fn resolve_part(
    part: &str,
    hosts: u32,
    rng: &mut ChaCha8Rng,
    out: &mut Vec<u32>,
) -> Result<(), String> {
    if part == "all" {
        out.extend(0..hosts);
    } else if let Some(rest) = part.strip_prefix("random:") {
        let (count, pool) = match rest.split_once('@') {
            Some((count, pool)) => (number(count, "count")?, range(pool, hosts)?),
            None => (number(rest, "count")?, (0..hosts).collect()),
        };
        if count as usize > pool.len() {
            return Err(format!(
                "'{part}': cannot draw {count} hosts from {}",
                pool.len()
            ));
        }
        // A partial Fisher-Yates shuffle: the first `count` are the draw.
        let mut pool = pool;
        for i in 0..count as usize {
            let j = i + (rng.next_u64() % (pool.len() - i) as u64) as usize;
            pool.swap(i, j);
        }
        out.extend_from_slice(&pool[..count as usize]);
    } else if part.contains('-') {
        out.extend(range(part, hosts)?);
    } else {
        resolve_index(number(part, "host index")?, hosts, out)?;
    }
    Ok(())
}

/// `ranks` shuffled with `seed` (a ring in random order, as htsim's
/// all-reduce generator makes it).
pub fn shuffled(ranks: &[u32], seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a4d_0a1e);
    let mut v = ranks.to_vec();
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> HostSetConf {
        HostSetConf::Spec(s.into())
    }

    #[test]
    fn forms_resolve_in_order() {
        assert_eq!(spec("all").resolve(4, 1).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(spec("2-5").resolve(8, 1).unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(spec("0-15:4").resolve(16, 1).unwrap(), vec![0, 4, 8, 12]);
        assert_eq!(spec("6-7, 0-1").resolve(8, 1).unwrap(), vec![6, 7, 0, 1]);
        let list = HostSetConf::List(vec![HostItem::Index(3), HostItem::Spec("5-6".into())]);
        assert_eq!(list.resolve(8, 1).unwrap(), vec![3, 5, 6]);
    }

    #[test]
    fn random_draws_are_seeded_distinct_and_within_the_pool() {
        let a = spec("random:16@32-63").resolve(128, 7).unwrap();
        assert_eq!(a, spec("random:16@32-63").resolve(128, 7).unwrap());
        assert_ne!(a, spec("random:16@32-63").resolve(128, 8).unwrap());
        let mut s = a.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 16);
        assert!(a.iter().all(|&h| (32..=63).contains(&h)));
    }

    #[test]
    fn errors_name_the_item() {
        let e = |s: &str, hosts| spec(s).resolve(hosts, 1).unwrap_err();
        assert_eq!(
            e("0-200", 128),
            "'0-200': host 200 is beyond the topology's 128 hosts (0-127)"
        );
        assert_eq!(e("9", 8), "host 9 is beyond the topology's 8 hosts (0-7)");
        assert_eq!(e("random:9", 8), "'random:9': cannot draw 9 hosts from 8");
        assert_eq!(e("0-3,3", 8), "host 3 is named twice");
        assert_eq!(e("5-2", 8), "'5-2': range runs backwards");
        assert_eq!(e("0-7:0", 8), "'0-7:0': stride must be at least 1");
        assert!(e("x", 8).contains("'x' is not a host index"));
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let r: Vec<u32> = (0..128).collect();
        let s = shuffled(&r, 3);
        assert_eq!(s, shuffled(&r, 3));
        assert_ne!(s, r);
        let mut t = s.clone();
        t.sort_unstable();
        assert_eq!(t, r);
    }
}
