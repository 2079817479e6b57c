//! Whole perf sessions over real sockets, client and server each with its
//! own device: in one process over 127.0.0.1 (ports picked at random from
//! free ranges, so parallel tests do not collide), and across two network
//! namespaces (`netns`). The routed ECMP fabric is its own test binary
//! (`tests/fabric`), so that nothing runs beside it while it measures.

use metaroce_perf::{self as perf, Figures, LocalOpts, Params, Session, Test};
use std::net::TcpListener;

mod netns;

fn params(_test: Test, size: u64, iters: u64) -> Params {
    Params {
        size,
        iters,
        duration_s: 0,
        qps: 1,
        tx_depth: 64,
        verify: true,
        mtu: 0,
        paths: 8,
        pattern_seed: 0xfeed,
        run_infinitely: false,
        buffer_bytes: None,
    }
}

fn loopback(test: Test, p: &Params, local: &LocalOpts) -> Session {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut out = None;
    perf::run_loopback(
        test,
        l,
        &[p.size],
        p,
        local,
        &mut |s| out = Some(s.clone()),
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{}: {e}", test.name()));
    out.expect("one session")
}

fn check_verified(test: Test, size: u64, iters: u64) {
    let p = params(test, size, iters);
    let s = loopback(
        test,
        &p,
        &LocalOpts {
            seed: 7,
            ..LocalOpts::default()
        },
    );
    assert_eq!(s.verified, Some(true), "{}: {}", test.name(), s.detail);
    match s.figures {
        Figures::Bw(f) => assert_eq!(f.iters, iters),
        Figures::Lat(f) => assert_eq!(f.iters, iters),
    }
}

#[test]
fn loopback_write_bw_verified() {
    check_verified(Test::WriteBw, 65_536, 200);
}

/// WRITE and READ over real sockets with every packet authenticated, then
/// encrypted: verified, and the receiver counted no authentication failure.
#[test]
fn loopback_authenticated_and_encrypted_verified() {
    for (encrypt, test) in [(false, Test::WriteBw), (true, Test::ReadBw)] {
        let p = params(test, 65_536, 100);
        let s = loopback(
            test,
            &p,
            &LocalOpts {
                seed: 11,
                auth: Some(perf::AuthOpts {
                    job_secret: [7; 32],
                    encrypt,
                }),
                ..LocalOpts::default()
            },
        );
        assert_eq!(s.verified, Some(true), "{}: {}", test.name(), s.detail);
        assert_eq!(s.stats.endpoint.rx_auth_failed, 0, "{:?}", s.stats);
        assert_eq!(s.stats.endpoint.rx_unauthenticated, 0, "{:?}", s.stats);
    }
}

#[test]
fn loopback_read_bw_verified() {
    check_verified(Test::ReadBw, 65_536, 200);
}

#[test]
fn loopback_send_bw_verified() {
    check_verified(Test::SendBw, 10_000, 300);
}

/// perftest's software rate limiter: a timed write-bw limited to 2 Gb/s
/// measures at most the limit (with 10 % for the one burst the limiter
/// lets go ahead of the rate, and the clock's reading of the last
/// completion) and, on a noisy host, at least half of it.
#[test]
fn loopback_write_bw_keeps_to_the_rate_limit() {
    let test = Test::WriteBw;
    let mut p = params(test, 65_536, 1000);
    p.duration_s = 1;
    let limit_bits_per_s = 2e9;
    let local = LocalOpts {
        seed: 31,
        rate_limit: Some(perf::RateLimit {
            rate: 2.0,
            units: perf::RateUnits::Gbps,
            burst: None,
        }),
        ..LocalOpts::default()
    };
    let s = loopback(test, &p, &local);
    assert_eq!(s.verified, Some(true), "{}", s.detail);
    let Figures::Bw(f) = s.figures else {
        panic!("write-bw measured no bandwidth")
    };
    let bits_per_s = f.avg_bps * 8.0;
    eprintln!(
        "write-bw limited to 2 Gb/s: {:.3} Gb/s ({} messages)",
        bits_per_s / 1e9,
        f.iters
    );
    assert!(
        bits_per_s <= 1.1 * limit_bits_per_s,
        "{bits_per_s} b/s above the limit"
    );
    assert!(
        bits_per_s >= 0.5 * limit_bits_per_s,
        "{bits_per_s} b/s: under half the limit"
    );
}

/// A loss-free transfer's timeouts on this side of it, printed, and
/// checked: no RTO may be proved lost (a later packet of its path arrived
/// while the first it gave up on had not) unless packets were really lost
/// (a SACK gap, a datagram the peer's kernel dropped at a full socket), and
/// every other RTO should be proved spurious by a later ACK and undone. A
/// timeout itself is allowed: a thread of a busy host (a loaded 2-vCPU CI
/// machine) waits milliseconds for its CPU, and its peer cannot tell that
/// from loss until the late ACK comes. At most one burst of them (every
/// path at once, `paths`) may still be undecided when the counters are
/// read: under a CPU hog on a machine at load 5, one run in about 25 left
/// 6 of 10 undecided (round 20 in BENCHMARKS.md).
fn check_no_false_rtos(
    what: &str,
    s: &metaroce_udp::DeviceStats,
    peer: &metaroce_udp::DeviceStats,
    paths: u64,
) {
    let e = &s.endpoint;
    let undecided = e.rtos_undecided();
    eprintln!(
        "{what}: {}, kernel drops at the peer {}",
        e.timeout_fates(),
        peer.io.rx_kernel_drops
    );
    let lost = e.data_packets_lost > 0 || peer.io.rx_kernel_drops > 0;
    assert!(
        e.rtos_proved_lost == 0 || lost,
        "{what}: {} RTOs proved lost on a run that lost nothing",
        e.rtos_proved_lost
    );
    assert!(
        undecided <= paths || lost,
        "{what}: {undecided} of {} RTOs neither proved spurious nor lost",
        e.rtos
    );
}

/// Healthy loopback runs (write-bw: the client sends the data; read-bw: the
/// server does) have no false RTOs (transport spec section 4, "Host stalls
/// are not losses"): each side's counters are checked.
#[test]
fn loopback_healthy_runs_have_no_false_rtos() {
    for test in [Test::WriteBw, Test::ReadBw] {
        let mut p = params(test, 65_536, 1000);
        p.duration_s = 2;
        let local = LocalOpts {
            seed: 23,
            ..LocalOpts::default()
        };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server_local = LocalOpts {
            seed: 24,
            ..LocalOpts::default()
        };
        let server = std::thread::spawn(move || {
            let mut stats = None;
            perf::serve(&l, test, &server_local, &mut |s| stats = Some(s.stats))
                .map(|()| stats.expect("one session"))
        });
        let s = perf::run_client(test, addr, &p, &local, true)
            .unwrap_or_else(|e| panic!("{}: {e}", test.name()));
        let server_stats = server
            .join()
            .expect("server thread")
            .unwrap_or_else(|e| panic!("{} server: {e}", test.name()));
        assert_eq!(s.verified, Some(true), "{}: {}", test.name(), s.detail);
        let paths = u64::from(p.paths);
        check_no_false_rtos(
            &format!("{} client", test.name()),
            &s.stats,
            &server_stats,
            paths,
        );
        check_no_false_rtos(
            &format!("{} server", test.name()),
            &server_stats,
            &s.stats,
            paths,
        );
    }
}

/// Two sides with different job secrets are refused at connect time, by
/// key confirmation, with an error that says so on both sides (not a
/// retry-exhausted WRITE that looks like a dead peer).
#[test]
fn different_job_secrets_are_refused_at_connect() {
    let test = Test::WriteBw;
    let p = params(test, 65_536, 100);
    let with_secret = |secret: [u8; 32], seed: u64| LocalOpts {
        seed,
        auth: Some(perf::AuthOpts {
            job_secret: secret,
            encrypt: false,
        }),
        ..LocalOpts::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server_opts = with_secret([1; 32], 21);
    let server =
        std::thread::spawn(move || perf::serve(&listener, test, &server_opts, &mut |_| {}));
    let client = perf::run_client(test, addr, &p, &with_secret([2; 32], 22), true);
    let client_err = client.map(|_| ()).unwrap_err().to_string();
    assert!(
        client_err.contains("key confirmation failed") && client_err.contains("job secret"),
        "{client_err}"
    );
    let server_err = server.join().unwrap().unwrap_err().to_string();
    assert!(
        server_err.contains("key confirmation failed") && server_err.contains("job secret"),
        "{server_err}"
    );
    // An all-zero secret never gets as far as the network.
    let zero = perf::run_client(test, addr, &p, &with_secret([0; 32], 23), true);
    assert!(
        zero.map(|_| ())
            .unwrap_err()
            .to_string()
            .contains("all zeros"),
        "zero secret accepted"
    );
}
