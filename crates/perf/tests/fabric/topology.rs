//! A routed fabric of network namespaces:
//!
//! ```text
//!   client ── r1 ══ N parallel links ══ r2 ── server
//!   (c0)   (r1c) (r1l0..)        (r2l0..) (r2s)  (s0)
//! ```
//!
//! Both routers reach the far subnet through a nexthop group of the N
//! links with the kernel's L4 hash (`fib_multipath_hash_policy=1`: source
//! and destination address and port, protocol), as an ECMP switch does.
//! Every link has the same MTU. Each router has an nftables table whose
//! `frags` chain counts forwarded IP fragments and whose `bh` chain holds
//! the blackhole rules ([`Fabric::blackhole`]): a silent drop on one link in
//! both directions, with carrier up and routes unchanged, so nothing but
//! the end hosts can notice (a gray failure).

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;

/// Run a command; its stderr is the error.
pub(crate) fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Move the calling thread into namespace `ns` (only this thread).
pub(crate) fn enter(ns: &str) -> Result<(), String> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).map_err(|e| e.to_string())?;
    // SAFETY: setns on a valid namespace fd; it changes only this thread's
    // network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

/// The fabric; its namespaces are deleted on drop.
pub(crate) struct Fabric {
    /// Namespaces: client, router 1, router 2, server.
    pub(crate) client: String,
    pub(crate) r1: String,
    pub(crate) r2: String,
    pub(crate) server: String,
    /// Parallel links between the routers.
    pub(crate) links: usize,
    /// The server's address.
    pub(crate) server_ip: IpAddr,
    /// Whether nftables is there (fragment counters and blackholes).
    pub(crate) nft: bool,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for n in [&self.client, &self.r1, &self.r2, &self.server] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v)
}

fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), String> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    in_ns(ns, &["sh", "-c", &format!("echo {value} > {path}")]).map(|_| ())
}

impl Fabric {
    /// Build the fabric: `links` parallel links, every link `mtu` bytes.
    /// `tag` keeps parallel runs apart.
    pub(crate) fn build(tag: u32, links: usize, mtu: u32) -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        sh(&["ip", "-V"]).map_err(|e| format!("iproute2 missing ({e})"))?;
        let n = 1 + tag % 200;
        let f = Self {
            client: format!("mrf{tag}c"),
            r1: format!("mrf{tag}r1"),
            r2: format!("mrf{tag}r2"),
            server: format!("mrf{tag}s"),
            links,
            server_ip: format!("10.{n}.2.2").parse().unwrap(),
            nft: sh(&["nft", "-v"]).is_ok(),
        };
        for ns in [&f.client, &f.r1, &f.r2, &f.server] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            sh(&["ip", "netns", "add", ns])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            for k in [
                "net.ipv4.conf.all.rp_filter",
                "net.ipv4.conf.default.rp_filter",
            ] {
                sysctl(ns, k, "0")?;
            }
        }
        let m = mtu.to_string();
        // One veth pair between two namespaces, addressed and up.
        let wire = |a_ns: &str, a: &str, a_ip: &str, b_ns: &str, b: &str, b_ip: &str| {
            sh(&[
                "ip", "-n", a_ns, "link", "add", a, "mtu", &m, "type", "veth", "peer", "name", b,
                "mtu", &m, "netns", b_ns,
            ])?;
            for (ns, dev, ip) in [(a_ns, a, a_ip), (b_ns, b, b_ip)] {
                sh(&["ip", "-n", ns, "addr", "add", ip, "dev", dev])?;
                sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            }
            Ok::<(), String>(())
        };
        wire(
            &f.client,
            "c0",
            &format!("10.{n}.1.1/24"),
            &f.r1,
            "r1c",
            &format!("10.{n}.1.2/24"),
        )?;
        wire(
            &f.r2,
            "r2s",
            &format!("10.{n}.2.1/24"),
            &f.server,
            "s0",
            &format!("10.{n}.2.2/24"),
        )?;
        for k in 0..links {
            wire(
                &f.r1,
                &format!("r1l{k}"),
                &format!("10.{n}.{}.1/24", 10 + k),
                &f.r2,
                &format!("r2l{k}"),
                &format!("10.{n}.{}.2/24", 10 + k),
            )?;
        }
        sh(&[
            "ip",
            "-n",
            &f.client,
            "route",
            "add",
            "default",
            "via",
            &format!("10.{n}.1.2"),
        ])?;
        sh(&[
            "ip",
            "-n",
            &f.server,
            "route",
            "add",
            "default",
            "via",
            &format!("10.{n}.2.1"),
        ])?;
        // Over veth a forwarded packet keeps the hash its sender's socket
        // gave it, and the router's L4 multipath hash takes that instead of
        // hashing the headers; Linux TCP draws a new socket hash after a
        // timeout, which would move the stream to another link as no ECMP
        // switch would. The hosts keep theirs (sysctl absent: older
        // kernels never rehash).
        for ns in [&f.client, &f.server] {
            let _ = sysctl(ns, "net.core.txrehash", "0");
        }
        // Each router: forwarding, L4 hashing, and the far subnet through a
        // nexthop group of every link.
        for (ns, me, far, far_subnet) in [
            (&f.r1, 1, 2, format!("10.{n}.2.0/24")),
            (&f.r2, 2, 1, format!("10.{n}.1.0/24")),
        ] {
            sysctl(ns, "net.ipv4.ip_forward", "1")?;
            sysctl(ns, "net.ipv4.fib_multipath_hash_policy", "1")?;
            let mut group = Vec::new();
            for k in 0..links {
                let id = (k + 1).to_string();
                sh(&[
                    "ip",
                    "-n",
                    ns,
                    "nexthop",
                    "add",
                    "id",
                    &id,
                    "via",
                    &format!("10.{n}.{}.{far}", 10 + k),
                    "dev",
                    &format!("r{me}l{k}"),
                ])?;
                group.push(id);
            }
            sh(&[
                "ip",
                "-n",
                ns,
                "nexthop",
                "add",
                "id",
                "100",
                "group",
                &group.join("/"),
            ])?;
            sh(&["ip", "-n", ns, "route", "add", &far_subnet, "nhid", "100"])?;
            if f.nft {
                let nft = |rule: &str| in_ns(ns, &["nft", rule]).map(|_| ());
                nft("add table inet mrfab")?;
                nft("add chain inet mrfab frags { type filter hook forward priority -10 ; }")?;
                nft("add rule inet mrfab frags ip frag-off & 0x3fff != 0 counter")?;
                nft("add chain inet mrfab bh { type filter hook forward priority 0 ; }")?;
            }
        }
        Ok(f)
    }

    /// Bytes each link has carried from router 1 toward router 2 (the
    /// client's data direction), from the interfaces' counters.
    pub(crate) fn link_tx_bytes(&self) -> Vec<u64> {
        (0..self.links)
            .map(|k| {
                let text = sh(&[
                    "ip",
                    "-n",
                    &self.r1,
                    "-s",
                    "-j",
                    "link",
                    "show",
                    "dev",
                    &format!("r1l{k}"),
                ])
                .unwrap_or_default();
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                v[0]["stats64"]["tx"]["bytes"].as_u64().unwrap_or(0)
            })
            .collect()
    }

    /// IP fragments anywhere: the hosts' fragmentation and reassembly
    /// counters (`/proc/net/snmp` FragCreates, ReasmReqds) and the
    /// fragments the routers forwarded (nftables counters).
    pub(crate) fn fragments(&self) -> u64 {
        let mut total = 0;
        for ns in [&self.client, &self.server, &self.r1, &self.r2] {
            let snmp = in_ns(ns, &["cat", "/proc/net/snmp"]).unwrap_or_default();
            let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
            if let (Some(names), Some(values)) = (ip.next(), ip.next()) {
                for (k, v) in names.split_whitespace().zip(values.split_whitespace()) {
                    if k == "FragCreates" || k == "ReasmReqds" {
                        total += v.parse::<u64>().unwrap_or(0);
                    }
                }
            }
        }
        if self.nft {
            for ns in [&self.r1, &self.r2] {
                let text = in_ns(ns, &["nft", "list", "chain", "inet", "mrfab", "frags"])
                    .unwrap_or_default();
                total += counter_packets(&text);
            }
        }
        total
    }

    /// Drop everything on link `k`, both directions, silently (carrier and
    /// routes stay up).
    pub(crate) fn blackhole(&self, k: usize) -> Result<(), String> {
        self.blackhole_matching(k, "")
    }

    /// Blackhole link `k` for UDP only. A perf session's side channel is a
    /// TCP connection across the same fabric: a gray failure under the
    /// MetaRoCE transfer must not also be one under the harness's control
    /// channel, or a session whose data finished would wait for ever on a
    /// stalled TCP stream (one TCP stream on a dead link stalls: that is
    /// the contrast this test draws, not what it measures).
    pub(crate) fn blackhole_udp(&self, k: usize) -> Result<(), String> {
        self.blackhole_matching(k, "meta l4proto udp ")
    }

    fn blackhole_matching(&self, k: usize, matching: &str) -> Result<(), String> {
        if !self.nft {
            return Err("nft not installed".into());
        }
        for (ns, dev) in [(&self.r1, format!("r1l{k}")), (&self.r2, format!("r2l{k}"))] {
            in_ns(
                ns,
                &[
                    "nft",
                    &format!("add rule inet mrfab bh oifname \"{dev}\" {matching}counter drop"),
                ],
            )?;
        }
        Ok(())
    }

    /// Lift every blackhole.
    pub(crate) fn heal(&self) {
        if self.nft {
            for ns in [&self.r1, &self.r2] {
                let _ = in_ns(ns, &["nft", "flush", "chain", "inet", "mrfab", "bh"]);
            }
        }
    }
}

/// The sum of `counter packets N` in an nft listing.
fn counter_packets(text: &str) -> u64 {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(3)
        .filter(|w| w[0] == "counter" && w[1] == "packets")
        .filter_map(|w| w[2].parse::<u64>().ok())
        .sum()
}
