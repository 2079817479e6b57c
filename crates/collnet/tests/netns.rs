//! Four ranks in four network namespaces joined by a bridge (each rank a
//! thread that entered its namespace with setns, its device and bootstrap
//! sockets made there): the bootstrap over the namespaces' addresses, then
//! every collective verified, clean and with 1 % of received datagrams
//! dropped. Skips (passing, with a message) where namespaces cannot be
//! made (not root, no iproute2, no permission).

mod common;

use common::{cfg, job};
use metaroce_coll::report::PerfCollective;
use metaroce_coll::{DataType, ReduceOp};
use metaroce_collnet::perf::{self, Measure};
use metaroce_collnet::{Impair, NetConfig, connect};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;

const WORLD: u32 = 4;

struct Namespaces {
    names: Vec<String>,
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A bridge namespace and one namespace per rank, rank `i` at
/// 10.212.N.(i+1)/24.
fn setup(tag: u32) -> Result<(Namespaces, Vec<IpAddr>), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let br = format!("mrc{tag}br");
    let mut ns = Namespaces {
        names: vec![br.clone()],
    };
    sh(&["ip", "netns", "add", &br])?;
    sh(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"])?;
    sh(&["ip", "-n", &br, "link", "set", "br0", "up"])?;
    let net = 1 + tag % 250;
    let mut ips = Vec::new();
    for i in 0..WORLD {
        let n = format!("mrc{tag}r{i}");
        sh(&["ip", "netns", "add", &n])?;
        ns.names.push(n.clone());
        let (a, b) = (format!("mc{tag}{i}a"), format!("mc{tag}{i}b"));
        sh(&[
            "ip", "link", "add", &a, "mtu", "9000", "type", "veth", "peer", "name", &b, "mtu",
            "9000",
        ])?;
        sh(&["ip", "link", "set", &a, "netns", &n])?;
        sh(&["ip", "link", "set", &b, "netns", &br])?;
        sh(&["ip", "-n", &br, "link", "set", &b, "master", "br0"])?;
        sh(&["ip", "-n", &br, "link", "set", &b, "up"])?;
        let ip = format!("10.212.{net}.{}", i + 1);
        sh(&[
            "ip",
            "-n",
            &n,
            "addr",
            "add",
            &format!("{ip}/24"),
            "dev",
            &a,
        ])?;
        sh(&["ip", "-n", &n, "link", "set", &a, "up"])?;
        sh(&["ip", "-n", &n, "link", "set", "lo", "up"])?;
        ips.push(ip.parse().unwrap());
    }
    Ok((ns, ips))
}

fn enter(ns: &str) -> Result<(), String> {
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

fn run_job(ns: &Namespaces, root: SocketAddr, c: &NetConfig, label: &str) {
    let threads: Vec<_> = (0..WORLD)
        .map(|rank| {
            let name = ns.names[1 + rank as usize].clone();
            let c = NetConfig {
                seed: 77 + u64::from(rank),
                impair: c.impair.map(|i| Impair {
                    seed: i.seed + u64::from(rank),
                    ..i
                }),
                ..c.clone()
            };
            let label = label.to_owned();
            std::thread::spawn(move || {
                enter(&name).expect("setns");
                let mut comm = connect(&job(rank, WORLD, root), &c)
                    .unwrap_or_else(|e| panic!("{label} rank {rank}: {e}"));
                assert_eq!(
                    comm.members()[rank as usize].device.ip(),
                    comm.device_addr().ip()
                );
                for collective in PerfCollective::ALL {
                    for bytes in [4, 65_540, 1 << 20] {
                        let m = Measure {
                            root: 2,
                            iters: 2,
                            warmup_iters: 1,
                            seed: bytes,
                            ..Measure::once(collective, bytes, DataType::Float32, ReduceOp::Sum)
                        };
                        let row = perf::measure_row(&mut comm, &m).unwrap_or_else(|e| {
                            panic!("{label} rank {rank} {}: {e}", collective.name())
                        });
                        assert_eq!(
                            row.out_of_place.wrong,
                            Some(0),
                            "{label} {} {bytes}",
                            collective.name()
                        );
                        assert_eq!(
                            row.in_place.wrong,
                            Some(0),
                            "{label} {} {bytes}",
                            collective.name()
                        );
                        if rank == 0 && bytes == 1 << 20 {
                            eprintln!(
                                "netns {label} {}: {:.2} GB/s busbw",
                                collective.name(),
                                row.out_of_place.bus_bw
                            );
                        }
                    }
                }
                comm.finish()
                    .unwrap_or_else(|e| panic!("{label} rank {rank}: {e}"));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a rank failed");
    }
}

#[test]
fn four_ranks_in_four_namespaces() {
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("SKIP netns test: `ip` (iproute2) not installed");
        return;
    }
    let (ns, ips) = match setup(std::process::id() % 100_000) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("SKIP netns test: cannot create network namespaces ({e})");
            return;
        }
    };
    let root = SocketAddr::new(ips[0], 29_500);
    run_job(&ns, root, &cfg(), "clean");
    let lossy = NetConfig {
        impair: Some("loss=0.01,seed=3".parse().unwrap()),
        ..cfg()
    };
    run_job(&ns, SocketAddr::new(ips[0], 29_501), &lossy, "1%-loss");
}
