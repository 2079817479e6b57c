//! `--json` / `--out_json`: perftest's JSON report, `{"test_info": {...},
//! "results": {...}}` with perftest's key names (`BW_peak`,
//! `percentile_99.9`, ...) and fixed decimals, plus what perftest leaves
//! out: a `schema_version`, and `parameters`, everything needed to run the
//! same test again.

use crate::params::auth_mode;
use crate::table::{bw_unit, max_inline};
use crate::{Figures, LocalOpts, Params, Test};
use serde::Serialize;

/// Version of this JSON layout; raised when a key changes meaning or goes.
pub const JSON_SCHEMA_VERSION: u32 = 1;

/// A finished run, for its JSON report.
#[derive(Debug, Clone, Copy)]
pub struct JsonRun<'a> {
    /// The test.
    pub test: Test,
    /// Its parameters (the last size's, with `-a`); `mtu` 0 if `-m` was
    /// left out (sized from the path).
    pub params: &'a Params,
    /// Payload bytes per packet the sessions used (what `-m` asked, or
    /// what the path carried).
    pub mtu: u32,
    /// Both sides sent data packets without the ICRC (wire.md 7.2).
    pub icrc_omitted: bool,
    /// This side's options.
    pub local: &'a LocalOpts,
    /// Bandwidth in Gb/s (else MiB/s).
    pub gbits: bool,
    /// `-a`: every size from 2 to 2^23.
    pub all_sizes: bool,
    /// The figures, one per size run.
    pub figures: &'a [Figures],
    /// This side's device counters at the end of the run (`name: value`,
    /// the names `--stats` prints), if any.
    pub counters: Option<&'a [(String, u64)]>,
}

/// Counters as a JSON object, in their order.
#[derive(Debug, Clone)]
struct CounterMap(Vec<(String, u64)>);

impl Serialize for CounterMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// `v` rounded to `decimals` places, as perftest prints it.
fn fixed(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// perftest's `results` object, in its key order.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum JsonResults {
    /// A bandwidth row.
    Bw {
        /// Message size, bytes.
        #[serde(rename = "MsgSize")]
        msg_size: u64,
        /// Operations completed.
        n_iterations: u64,
        /// Peak bandwidth (0 when not measured), in `BW_unit`.
        #[serde(rename = "BW_peak")]
        bw_peak: f64,
        /// Average bandwidth, in `BW_unit`.
        #[serde(rename = "BW_average")]
        bw_average: f64,
        /// Million messages per second.
        #[serde(rename = "MsgRate")]
        msg_rate: f64,
    },
    /// A latency row (by iterations), microseconds.
    Lat {
        /// Message size, bytes.
        #[serde(rename = "MsgSize")]
        msg_size: u64,
        /// Samples.
        n_iterations: u64,
        /// Minimum.
        t_min: f64,
        /// Maximum (after dropping the 2 largest).
        t_max: f64,
        /// Median.
        t_typical: f64,
        /// Mean.
        t_avg: f64,
        /// Standard deviation.
        t_stdev: f64,
        /// 99th percentile.
        percentile_99: f64,
        /// 99.9th percentile.
        #[serde(rename = "percentile_99.9")]
        percentile_99_9: f64,
    },
    /// A latency row of a `-D` run.
    LatDuration {
        /// Message size, bytes.
        #[serde(rename = "MsgSize")]
        msg_size: u64,
        /// Samples.
        n_iterations: u64,
        /// Mean, microseconds.
        t_avg: f64,
        /// Round trips per second.
        tps_average: f64,
    },
}

/// perftest's `results` object for one row (`duration`: a `-D` run).
pub fn json_results(fig: &Figures, gbits: bool, duration: bool) -> JsonResults {
    match fig {
        Figures::Bw(f) => JsonResults::Bw {
            msg_size: f.size,
            n_iterations: f.iters,
            bw_peak: fixed(bw_unit(f.peak_bps, gbits), 2),
            bw_average: fixed(bw_unit(f.avg_bps, gbits), 2),
            msg_rate: fixed(f.msg_rate_mpps, 6),
        },
        Figures::Lat(f) if duration => JsonResults::LatDuration {
            msg_size: f.size,
            n_iterations: f.iters,
            t_avg: fixed(f.t_avg, 2),
            tps_average: fixed(f.tps, 2),
        },
        Figures::Lat(f) => JsonResults::Lat {
            msg_size: f.size,
            n_iterations: f.iters,
            t_min: fixed(f.t_min, 2),
            t_max: fixed(f.t_max, 2),
            t_typical: fixed(f.t_typical, 2),
            t_avg: fixed(f.t_avg, 2),
            t_stdev: fixed(f.t_stdev, 2),
            percentile_99: fixed(f.p99, 2),
            percentile_99_9: fixed(f.p99_9, 2),
        },
    }
}

/// perftest's `test_info` object, in its key order, with MetaRoCE's own
/// additions at the end (`Paths`, `Packet_auth`, `ICRC`, `BW_unit`).
#[derive(Debug, Clone, Serialize)]
#[allow(non_snake_case)]
struct TestInfo {
    test: String,
    Dual_port: &'static str,
    Device: &'static str,
    Number_of_qps: u32,
    Transport_type: &'static str,
    Connection_type: &'static str,
    Using_SRQ: &'static str,
    PCIe_relax_order: &'static str,
    TX_depth: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    Post_List: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    CQ_Moderation: Option<u32>,
    Mtu: u32,
    Link_type: &'static str,
    Max_inline_data: u32,
    rdma_cm_QPs: &'static str,
    Data_ex_method: &'static str,
    Paths: u32,
    Packet_auth: &'static str,
    ICRC: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    BW_unit: Option<&'static str>,
}

fn test_info(r: &JsonRun<'_>) -> TestInfo {
    let p = r.params;
    let bw = !r.test.is_lat();
    TestInfo {
        test: r.test.title().replace(' ', "_"),
        Dual_port: "OFF",
        Device: "metaroce-udp",
        Number_of_qps: p.qps,
        Transport_type: "MetaRoCE/UDP",
        Connection_type: "RC",
        Using_SRQ: "OFF",
        PCIe_relax_order: "OFF",
        TX_depth: p.tx_depth,
        Post_List: bw.then_some(r.local.measure.post_list),
        CQ_Moderation: bw.then(|| r.local.measure.cq_mod_for(p)),
        Mtu: r.mtu,
        Link_type: "Ethernet",
        Max_inline_data: max_inline(r.test, r.local),
        rdma_cm_QPs: "OFF",
        Data_ex_method: "Ethernet",
        Paths: p.paths,
        Packet_auth: auth_mode(r.local.auth.as_ref()),
        ICRC: if r.icrc_omitted { "omitted" } else { "on" },
        BW_unit: bw.then_some(if r.gbits { "Gb/sec" } else { "MiB/sec" }),
    }
}

/// Everything that chose how the run went, under the command's own option
/// names: with the same values (and hosts) the run can be repeated. `mtu`
/// is the MTU used, `mtu_from_path` whether `-m` was left out so the path
/// sized it; `buffer_bytes` the bytes each side's messages cycle
/// through; `icrc` is the `--icrc` flag and `icrc_omitted` what the two
/// sides agreed; `rto_min_us` is the floor in force; `rate_limit`,
/// `rate_units`, `rate_limit_type` and `burst_size` (the burst in force)
/// are there only for a rate-limited run.
#[derive(Debug, Clone, Serialize)]
struct Parameters {
    test: &'static str,
    size: u64,
    all_sizes: bool,
    iters: u64,
    duration_s: u64,
    run_infinitely: bool,
    buffer_bytes: u64,
    qps: u32,
    tx_depth: u32,
    mtu: u32,
    mtu_from_path: bool,
    paths: u32,
    seed: u64,
    pattern_seed: u64,
    cq_mod: u32,
    post_list: u32,
    inline_size: u32,
    peak: bool,
    verify: bool,
    auth: &'static str,
    impair: Option<String>,
    offload: bool,
    direct_placement: bool,
    dev_port: u16,
    icrc: bool,
    icrc_omitted: bool,
    rto_min_us: u64,
    path_burst_bytes: u32,
    engine_nice: Option<i32>,
    block_when_contended: bool,
    report_gbits: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_units: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst_size: Option<u64>,
}

fn parameters(r: &JsonRun<'_>) -> Parameters {
    let (p, l) = (r.params, r.local);
    Parameters {
        test: r.test.name(),
        size: p.size,
        all_sizes: r.all_sizes,
        iters: p.iters,
        duration_s: p.duration_s,
        run_infinitely: p.run_infinitely,
        buffer_bytes: p.buffer_len(r.test),
        qps: p.qps,
        tx_depth: p.tx_depth,
        mtu: r.mtu,
        mtu_from_path: p.mtu == 0,
        paths: p.paths,
        seed: l.seed,
        pattern_seed: p.pattern_seed,
        cq_mod: l.measure.cq_mod_for(p),
        post_list: l.measure.post_list,
        inline_size: l.measure.inline_bytes,
        peak: l.measure.peak,
        verify: p.verify,
        auth: auth_mode(l.auth.as_ref()),
        impair: l.impair.map(|i| i.to_string()),
        offload: l.offload,
        direct_placement: l.direct_placement,
        dev_port: l.dev_port,
        icrc: !l.icrc_omission,
        icrc_omitted: r.icrc_omitted,
        rto_min_us: if l.rto_min_ns > 0 {
            l.rto_min_ns
        } else {
            crate::RTO_MIN_NS
        } / 1000,
        path_burst_bytes: l.path_burst_bytes.unwrap_or(metaroce_udp::PATH_BURST_BYTES),
        engine_nice: l.engine_nice,
        block_when_contended: l.blocks_when_contended(r.test),
        report_gbits: r.gbits,
        rate_limit: l.rate_limit.map(|x| x.rate),
        rate_units: l.rate_limit.map(|x| x.units.flag()),
        // The only limiter there is: the requester's own pacing.
        rate_limit_type: l.rate_limit.map(|_| "SW"),
        burst_size: l.rate_limit.map(|x| x.burst_for(p, &l.measure)),
    }
}

/// The whole report: serialize it (keys keep perftest's order).
#[derive(Debug, Clone, Serialize)]
pub struct JsonReport {
    schema_version: u32,
    test_info: TestInfo,
    results: Option<JsonResults>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    results_by_size: Vec<JsonResults>,
    parameters: Parameters,
    #[serde(skip_serializing_if = "Option::is_none")]
    counters: Option<CounterMap>,
}

/// The whole report. `results` is the last size's (perftest rewrites its
/// file for every size of `-a`, so that is what it leaves); with more than
/// one size, `results_by_size` holds them all.
pub fn json_report(r: &JsonRun<'_>) -> JsonReport {
    let duration = r.params.duration_s > 0;
    let rows: Vec<JsonResults> = r
        .figures
        .iter()
        .map(|f| json_results(f, r.gbits, duration))
        .collect();
    JsonReport {
        schema_version: JSON_SCHEMA_VERSION,
        test_info: test_info(r),
        results: rows.last().cloned(),
        results_by_size: if rows.len() > 1 { rows } else { Vec::new() },
        parameters: parameters(r),
        counters: r.counters.map(|c| CounterMap(c.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BwFigures, LatFigures};

    fn params() -> Params {
        Params {
            size: 65_536,
            iters: 5000,
            duration_s: 0,
            qps: 2,
            tx_depth: 128,
            verify: true,
            mtu: 4096,
            paths: 16,
            pattern_seed: 9,
            run_infinitely: false,
            buffer_bytes: None,
        }
    }

    /// The layout and key names are perftest's.
    #[test]
    fn layout_is_perftests() {
        let p = params();
        let local = LocalOpts {
            seed: 9,
            ..LocalOpts::default()
        };
        let bw = Figures::Bw(BwFigures {
            size: 65_536,
            iters: 5000,
            peak_bps: 11.5e9,
            avg_bps: 11.0e9,
            msg_rate_mpps: 0.167_847_1,
        });
        let run = JsonRun {
            test: Test::WriteBw,
            params: &p,
            mtu: 4096,
            icrc_omitted: true,
            local: &local,
            gbits: true,
            all_sizes: false,
            figures: &[bw],
            counters: Some(&[
                ("rx_datagrams".into(), 5),
                ("conn.10.0.0.2:4793.rtos".into(), 1),
            ]),
        };
        let report = json_report(&run);
        let text = serde_json::to_string(&report).unwrap();
        assert!(
            text.starts_with(r#"{"schema_version":1,"test_info":{"test":"RDMA_Write_BW_Test","#),
            "{text}"
        );
        assert!(text.contains(r#""results":{"MsgSize":65536,"n_iterations":5000,"BW_peak":92.0,"#));
        let doc = serde_json::to_value(&report).unwrap();
        assert_eq!(doc["schema_version"], 1);
        assert_eq!(doc["test_info"]["test"], "RDMA_Write_BW_Test");
        assert_eq!(doc["test_info"]["Number_of_qps"], 2);
        assert_eq!(doc["test_info"]["CQ_Moderation"], 1);
        assert_eq!(doc["results"]["BW_average"], 88.0);
        assert_eq!(doc["results"]["MsgRate"], 0.167847);
        assert_eq!(doc["parameters"]["seed"], 9);
        assert_eq!(doc["parameters"]["qps"], 2);
        assert_eq!(doc["test_info"]["Mtu"], 4096);
        assert_eq!(doc["test_info"]["ICRC"], "omitted");
        assert_eq!(doc["parameters"]["mtu_from_path"], false);
        assert_eq!(doc["parameters"]["icrc_omitted"], true);
        assert_eq!(doc["parameters"]["rto_min_us"], 4000);
        assert!(doc.get("results_by_size").is_none());
        assert!(doc["parameters"].get("rate_limit").is_none());
        assert_eq!(doc["counters"]["rx_datagrams"], 5);
        assert_eq!(doc["counters"]["conn.10.0.0.2:4793.rtos"], 1);
        let limited = LocalOpts {
            rate_limit: Some(crate::RateLimit {
                rate: 2.5,
                units: crate::RateUnits::MiBps,
                burst: None,
            }),
            ..local.clone()
        };
        let doc = serde_json::to_value(json_report(&JsonRun {
            local: &limited,
            ..run
        }))
        .unwrap();
        assert_eq!(doc["parameters"]["rate_limit"], 2.5);
        assert_eq!(doc["parameters"]["rate_units"], "M");
        assert_eq!(doc["parameters"]["rate_limit_type"], "SW");
        assert_eq!(doc["parameters"]["burst_size"], 32);
        let lat = Figures::Lat(LatFigures::from_samples(2, vec![1000; 100], 1_000_000));
        let row = serde_json::to_string(&json_results(&lat, false, false)).unwrap();
        assert!(
            row.ends_with(r#""percentile_99":1.0,"percentile_99.9":1.0}"#),
            "{row}"
        );
        let row = serde_json::to_string(&json_results(&lat, false, true)).unwrap();
        assert!(
            row.contains("tps_average") && !row.contains("t_min"),
            "{row}"
        );
    }
}
