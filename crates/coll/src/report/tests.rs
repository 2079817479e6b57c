//! The expected strings below are what nccl-tests' format strings produce
//! for the same values (worked out column by column from `util.cu`).

use super::*;

#[test]
fn float_columns_pick_the_widest_precision_that_fits() {
    assert_eq!(c_float(95.123, 7), "  95.12");
    assert_eq!(c_float(0.0, 6), "  0.00");
    assert_eq!(c_float(123.456, 6), "123.46");
    assert_eq!(c_float(1234.56, 6), "1234.6");
    assert_eq!(c_float(12345.6, 6), " 12346");
    assert_eq!(c_float(123456.789, 7), " 123457");
    assert_eq!(c_float(12345678.9, 7), "1.2e+07");
    assert_eq!(c_float(1234567.0, 6), " 1e+06");
    assert_eq!(c_float(0.125, 6), "  0.12"); // ties to even, like glibc
}

#[test]
fn percent_g() {
    assert_eq!(c_g(0.0), "0");
    assert_eq!(c_g(3.0), "3");
    assert_eq!(c_g(20.6712345), "20.6712");
    assert_eq!(c_g(100000.0), "100000");
    assert_eq!(c_g(1234567.0), "1.23457e+06");
    assert_eq!(c_g(999999.5), "1e+06");
    assert_eq!(c_g(0.0001), "0.0001");
    assert_eq!(c_g(0.00001234), "1.234e-05");
    assert_eq!(c_g(-2.5), "-2.5");
    assert_eq!(c_g(f64::NAN), "nan");
    assert_eq!(c_g(1e100), "1e+100");
}

#[test]
fn bus_bandwidth_factors() {
    use PerfCollective::*;
    assert_eq!(AllReduce.bus_bw_factor(8), 2.0 * 7.0 / 8.0);
    assert_eq!(AllReduce.bus_bw_factor(1), 0.0);
    for c in [AllGather, ReduceScatter, AllToAll] {
        assert_eq!(c.bus_bw_factor(4), 0.75);
    }
    for c in [Broadcast, Reduce, SendRecv] {
        assert_eq!(c.bus_bw_factor(5), 1.0);
    }
    let (alg, bus) = AllReduce.bandwidths(1_000_000_000, 0.5, 4);
    assert_eq!((alg, bus), (2.0, 3.0));
}

#[test]
fn counts_follow_nccl_tests() {
    use PerfCollective::*;
    let f = DataType::Float32;
    let ag = AllGather.counts(1 << 20, f, 8);
    assert_eq!(
        (ag.send_count, ag.recv_count, ag.param_count),
        (32768, 262144, 32768)
    );
    assert_eq!(ag.size_bytes(f), 1 << 20);
    assert_eq!(ag.send_in_place_offset, 32768);
    // Per-rank blocks round down to 16 bytes: 250 / 3 = 83 floats -> 80.
    let rs = ReduceScatter.counts(1000, f, 3);
    assert_eq!(
        (
            rs.send_count,
            rs.recv_count,
            rs.param_count,
            rs.recv_in_place_offset
        ),
        (240, 80, 80, 80)
    );
    assert_eq!(rs.size_bytes(f), 960);
    let a2a = AllToAll.counts(1000, DataType::Float64, 3);
    assert_eq!((a2a.param_count, a2a.send_count), (40, 120));
    let ar = AllReduce.counts(1001, f, 3);
    assert_eq!((ar.param_count, ar.size_bytes(f)), (250, 1000));
    // Below one 16-byte block per rank nothing is left.
    assert_eq!(AllGather.counts(8, f, 4).param_count, 0);
}

#[test]
fn names() {
    assert_eq!("all_reduce".parse(), Ok(PerfCollective::AllReduce));
    assert_eq!("alltoall_perf".parse(), Ok(PerfCollective::AllToAll));
    assert!("allreduce".parse::<PerfCollective>().is_err());
    for c in PerfCollective::ALL {
        assert_eq!(c.program_name().parse(), Ok(c));
    }
    assert_eq!(
        ResultRow::labels(
            PerfCollective::AllGather,
            DataType::Float16,
            ReduceOp::Max,
            3
        ),
        ("half".into(), "none".into(), -1)
    );
    assert_eq!(
        ResultRow::labels(PerfCollective::Reduce, DataType::Bfloat16, ReduceOp::Max, 3),
        ("bfloat16".into(), "max".into(), 3)
    );
}

fn row() -> ResultRow {
    ResultRow {
        size_bytes: 1048576,
        count: 262144,
        type_name: "float".into(),
        redop: "sum".into(),
        root: -1,
        out_of_place: Measurement {
            time_us: 95.123,
            alg_bw: 11.0234,
            bus_bw: 20.669,
            wrong: Some(0),
        },
        in_place: Measurement {
            time_us: 94.8,
            alg_bw: 11.06,
            bus_bw: 20.74,
            wrong: None,
        },
    }
}

#[test]
fn table() {
    let header = format_table_header();
    let lines: Vec<&str> = header.lines().collect();
    assert_eq!(lines[0], "#");
    assert_eq!(
        lines[1],
        "#                                                              out-of-place                       in-place          "
    );
    assert_eq!(
        lines[2],
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
    );
    assert_eq!(
        lines[3],
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
    );
    assert_eq!(
        format_row(&row()),
        "     1048576        262144     float     sum      -1    95.12   11.02   20.67       0    94.80   11.06   20.74    N/A\n"
    );
    // Data columns line up under their names.
    let data = format_row(&row());
    for name in [
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
    ] {
        let end = lines[2].find(name).unwrap() + name.len();
        assert_eq!(
            &data[end..end + 1],
            if end == data.len() - 1 { "\n" } else { " " },
            "{name}"
        );
        assert_ne!(&data[end - 1..end], " ", "{name}");
    }
}

#[test]
fn footer() {
    let mut failed = row();
    failed.in_place.wrong = Some(3);
    let rows = vec![row(), failed];
    assert_eq!(out_of_bounds(&rows), 1);
    assert!((average_bus_bw(&rows) - (20.669 + 20.74) / 2.0).abs() < 1e-12);
    assert_eq!(
        format_footer(0, 20.7045, None, "all_reduce_perf", None),
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 20.7045 \n#\n# Collective test concluded: all_reduce_perf\n#\n\n"
    );
    assert_eq!(
        format_footer(2, 1.0, Some(5.0), "reduce_perf", Some("boom")),
        "# Out of bounds values : 2 FAILED\n# Avg bus bandwidth    : 1 FAILED\n#\n# Collective test concluded: reduce_perf\n#\n# error: boom\n"
    );
}

#[test]
fn header() {
    let h = RunHeader {
        program: "all_reduce_perf".into(),
        writer: "metaroce-coll 0.1.0".into(),
        min_bytes: 8,
        max_bytes: 134217728,
        step_factor: 2,
        step_bytes: 1048576,
        warmup_iters: 1,
        iters: 20,
        agg_iters: 1,
        validation: 1,
        blocking: 0,
        devices: vec![DeviceLine {
            rank: 0,
            group: 0,
            pid: 1234,
            hostname: "localhost".into(),
            device: 0,
            pci: (0, 0, 0),
            name: "MetaRoCE over UDP".into(),
        }],
    };
    assert_eq!(
        format_header(&h),
        "# nccl-tests version 2.19.6 format, written by metaroce-coll 0.1.0\n\
         # Collective test starting: all_reduce_perf\n\
         # nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n\
         #\n\
         # Using devices\n\
         #  Rank  0 Group  0 Pid   1234 on  localhost device  0 [0000:00:00] MetaRoCE over UDP\n"
    );
    let z = RunHeader {
        step_factor: 1,
        blocking: 1,
        devices: vec![],
        ..h
    };
    let s = format_header(&z);
    assert!(s.contains("step: 1048576(bytes)"));
    assert!(s.contains("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"));
}
