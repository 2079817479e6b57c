//! What the `tracing` events cost when nobody listens: a whole RDMA WRITE
//! between two in-memory endpoints (`testing::Pair`, virtual time), timed
//! from the post to the completion, once on a clean wire and once with
//! losses that make paths time out, retire and probe (the points where the
//! core emits events).
//!
//! Run it twice and compare the medians:
//!
//! ```sh
//! cargo bench -p metaroce-proto --bench trace_cost -- --save-baseline trace-on
//! cargo bench -p metaroce-proto --bench trace_cost --no-default-features -- --baseline trace-on
//! ```
//!
//! The first build has the events compiled in (feature `trace`, the
//! default) and no subscriber installed, as every tool runs unless
//! `METAROCE_LOG` or `RUST_LOG` is set; the second has no event at all.
//! Criterion's comparison line is the answer (BENCHMARKS.md records it).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use metaroce_proto::testing::{Fate, Pair, Side};
use metaroce_proto::{AccessFlags, EndpointConfig, MrInfo, QpCaps, QpHandle, SendWr, Sge, WrOp};
use std::hint::black_box;
use std::time::Duration;

/// The WRITE: 256 packets of 4 KiB.
const MSG_BYTES: u64 = 1 << 20;
/// Virtual time of one exchange.
const HOP_NS: u64 = 5_000;

struct Setup {
    pair: Pair,
    qp: QpHandle,
    src: MrInfo,
    dst: MrInfo,
}

fn setup(lossy: bool) -> Setup {
    let cfg = |seed| EndpointConfig {
        seed,
        paths_per_connection: 8,
        ..EndpointConfig::default()
    };
    let mut pair = Pair::new(Pair::A_IP, cfg(1), Pair::B_IP, cfg(2)).expect("valid config");
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    let pa = pair.a.alloc_pd();
    let src = pair
        .a
        .register_memory(pa, MSG_BYTES, AccessFlags::LOCAL_WRITE)
        .expect("source region");
    let qa = pair.a.create_qp(pa, caps, AccessFlags::NONE).expect("QP a");
    let pb = pair.b.alloc_pd();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst = pair
        .b
        .register_memory(pb, MSG_BYTES, access)
        .expect("target region");
    let qb = pair.b.create_qp(pb, caps, AccessFlags::NONE).expect("QP b");
    pair.b
        .set_qp_remote_access(qb, AccessFlags::REMOTE_WRITE)
        .expect("QP access");
    pair.connect(qa, qb).expect("connect");
    if lossy {
        // The first path's source port is a dead route, every 23rd data
        // packet and every 7th ACK are lost: SACK recovery, tail-loss
        // probes, path RTOs and a retirement all happen.
        let mut dead_port = None;
        pair.set_filter(Some(Box::new(move |hop| {
            let period = if hop.from == Side::A { 23 } else { 7 };
            let dead_route = hop.from == Side::A
                && *dead_port.get_or_insert(hop.transmit.src_port) == hop.transmit.src_port;
            if dead_route || hop.index % period == period - 1 {
                Fate::Drop
            } else {
                Fate::Deliver
            }
        })));
    }
    pair.set_now(1_000_000);
    Setup {
        pair,
        qp: qa,
        src,
        dst,
    }
}

/// Post the WRITE and run the pair until it completes; the timed part.
fn write_once(s: &mut Setup) {
    let wr = SendWr::new(
        1,
        WrOp::Write {
            remote_addr: s.dst.addr,
            rkey: s.dst.rkey,
        },
        vec![Sge {
            addr: s.src.addr,
            length: MSG_BYTES as u32,
            lkey: s.src.lkey,
        }],
    );
    s.pair.a.post_send(s.qp, wr).expect("post WRITE");
    for _ in 0..1_000_000 {
        if let Some(c) = s.pair.a.poll_completion() {
            black_box(c);
            return;
        }
        s.pair.step();
        // Like a wire's delay: at least a hop, or on to the next timer.
        let now = s.pair.now();
        let next = s
            .pair
            .next_deadline()
            .map_or(HOP_NS, |d| d.saturating_sub(now));
        s.pair.advance(next.max(HOP_NS));
    }
    panic!("the WRITE did not complete");
}

fn trace_cost(c: &mut Criterion) {
    // The lossy run does reach the traced points.
    let mut s = setup(true);
    write_once(&mut s);
    let st = *s.pair.a.stats();
    eprintln!(
        "lossy WRITE: {} resent, {} tail probes, {} RTOs, {} paths retired",
        st.data_packets_retransmitted, st.tail_probes, st.rtos, st.paths_replaced
    );
    let mut group = c.benchmark_group("trace_cost");
    group.throughput(Throughput::Bytes(MSG_BYTES));
    for (name, lossy) in [("write_1mib_clean", false), ("write_1mib_lossy", true)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || setup(lossy),
                |mut s| write_once(&mut s),
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = trace_cost
}
criterion_main!(benches);
