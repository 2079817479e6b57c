//! Two network namespaces joined by a veth pair: server in one, client in
//! the other (each side a thread that entered its namespace with setns),
//! verified WRITE, READ and SEND; then again with nftables dropping 1 % of
//! the UDP datagrams arriving in the server's namespace. Skips (passing,
//! with a message) where namespaces cannot be made.

use metaroce_perf::{self as perf, LocalOpts, Test};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::process::Command;

struct Netns {
    a: String,
    b: String,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
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

fn setup(tag: u32) -> Result<(Netns, IpAddr, IpAddr), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let ns = Netns {
        a: format!("mrt{tag}a"),
        b: format!("mrt{tag}b"),
    };
    let (va, vb) = (format!("mrv{tag}a"), format!("mrv{tag}b"));
    let net = 1 + tag % 250;
    let (ipa, ipb) = (format!("10.211.{net}.1"), format!("10.211.{net}.2"));
    sh(&["ip", "netns", "add", &ns.a])?;
    sh(&["ip", "netns", "add", &ns.b])?;
    sh(&[
        "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
    ])?;
    sh(&["ip", "link", "set", &va, "netns", &ns.a])?;
    sh(&["ip", "link", "set", &vb, "netns", &ns.b])?;
    sh(&[
        "ip",
        "-n",
        &ns.a,
        "addr",
        "add",
        &format!("{ipa}/24"),
        "dev",
        &va,
    ])?;
    sh(&[
        "ip",
        "-n",
        &ns.b,
        "addr",
        "add",
        &format!("{ipb}/24"),
        "dev",
        &vb,
    ])?;
    for (n, v) in [(&ns.a, &va), (&ns.b, &vb)] {
        sh(&["ip", "-n", n, "link", "set", v, "up"])?;
        sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
    }
    Ok((ns, ipa.parse().unwrap(), ipb.parse().unwrap()))
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

const TESTS: [(Test, u64); 3] = [
    (Test::WriteBw, 65_536),
    (Test::ReadBw, 65_536),
    (Test::SendBw, 16_384),
];

fn run_all(ns: &Netns, server_ip: IpAddr, label: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    let a = ns.a.clone();
    let server = std::thread::spawn(move || {
        enter(&a).expect("setns server");
        for (test, _) in TESTS {
            let l = TcpListener::bind(SocketAddr::new(server_ip, 0)).expect("listen");
            tx.send(l.local_addr().unwrap()).unwrap();
            perf::serve(&l, test, &LocalOpts::default(), &mut |_| {}).expect("serve");
        }
    });
    let b = ns.b.clone();
    let label = label.to_string();
    let client = std::thread::spawn(move || {
        enter(&b).expect("setns client");
        for (test, size) in TESTS {
            let addr = rx.recv().unwrap();
            let p = super::params(test, size, 300);
            let s = perf::run_client(test, addr, &p, &LocalOpts::default(), true)
                .unwrap_or_else(|e| panic!("{label} {}: {e}", test.name()));
            assert_eq!(
                s.verified,
                Some(true),
                "{label} {}: {}",
                test.name(),
                s.detail
            );
            eprintln!("netns {label} {}: {}", test.name(), s.detail);
        }
    });
    client.join().expect("client");
    server.join().expect("server");
}

#[test]
fn netns_verified_write_read_send_with_and_without_nft_loss() {
    let have_ip = Command::new("ip").arg("-V").output().is_ok();
    if !have_ip {
        eprintln!("SKIP netns test: `ip` (iproute2) not installed");
        return;
    }
    let (ns, ipa, _ipb) = match setup(std::process::id() % 100_000) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("SKIP netns test: cannot create network namespaces ({e})");
            return;
        }
    };
    run_all(&ns, ipa, "clean");
    if Command::new("nft").arg("-v").output().is_err() {
        eprintln!("SKIP netns nftables part: `nft` not installed");
        return;
    }
    let a = ns.a.as_str();
    sh(&[
        "ip", "netns", "exec", a, "nft", "add", "table", "inet", "mrloss",
    ])
    .unwrap();
    sh(&[
        "ip",
        "netns",
        "exec",
        a,
        "nft",
        "add",
        "chain",
        "inet",
        "mrloss",
        "in",
        "{ type filter hook input priority 0 ; }",
    ])
    .unwrap();
    sh(&[
        "ip", "netns", "exec", a, "nft", "add", "rule", "inet", "mrloss", "in", "meta", "l4proto",
        "udp", "numgen", "random", "mod", "100", "<", "1", "counter", "drop",
    ])
    .unwrap();
    run_all(&ns, ipa, "nft-1%-loss");
    let out = Command::new("ip")
        .args(["netns", "exec", a, "nft", "list", "table", "inet", "mrloss"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(text.contains("counter packets"), "{text}");
    assert!(
        !text.contains("counter packets 0 "),
        "the rule dropped nothing: {text}"
    );
}
