//! perftest's output: the header block and the bandwidth and latency
//! tables and their rows (`--out_json` is in `json.rs`).

use crate::params::auth_mode;
use crate::{BwFigures, LatFigures, LocalOpts, Params, Test};

/// perftest's dashed line.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's header block for a test (title and settings).
pub fn header(test: Test, p: &Params, local: &LocalOpts) -> String {
    let mut s = String::new();
    s.push_str(RESULT_LINE);
    s.push('\n');
    s.push_str(&format!("                    {}\n", test.title()));
    s.push_str(" Dual-port       : OFF\t\tDevice         : metaroce-udp\n");
    s.push_str(&format!(
        " Number of qps   : {}\t\tTransport type : MetaRoCE/UDP\n",
        p.qps
    ));
    s.push_str(" Connection type : RC\t\tUsing SRQ      : OFF\n");
    s.push_str(" PCIe relax order: OFF\t\tLock-free      : OFF\n");
    s.push_str(&format!(" TX depth        : {}\n", p.tx_depth));
    if !test.is_lat() {
        s.push_str(&format!(
            " CQ Moderation   : {}\n",
            local.measure.cq_mod_for(p)
        ));
        s.push_str(&format!(" Post List       : {}\n", local.measure.post_list));
    }
    if p.mtu == 0 {
        // Not known before the session: each side sizes it from its path.
        s.push_str(" Mtu             : from the path\n");
    } else {
        s.push_str(&format!(" Mtu             : {}[B]\n", p.mtu));
    }
    s.push_str(" Link type       : Ethernet\n");
    s.push_str(&format!(" Paths           : {}\n", p.paths));
    s.push_str(&format!(
        " Max inline data : {}[B]\n",
        max_inline(test, local)
    ));
    s.push_str(" rdma_cm QPs\t : OFF\n");
    s.push_str(" Data ex. method : Ethernet (TCP side channel)\n");
    s.push_str(&format!(
        " Packet auth     : {}\n",
        match auth_mode(local.auth.as_ref()) {
            "none" => "OFF",
            "authenticated" => "AES-256-GCM, payload in clear",
            _ => "AES-256-GCM, payload encrypted",
        }
    ));
    s.push_str(RESULT_LINE);
    s
}

/// The inline limit a test runs with (READ and atomics have none).
pub(crate) fn max_inline(test: Test, local: &LocalOpts) -> u32 {
    if local.measure.inline(test, 0) {
        local.measure.inline_bytes
    } else {
        0
    }
}

/// The bandwidth table header.
pub fn bw_table_header(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
    }
}

/// The latency table header (iterations mode).
pub const LAT_TABLE_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// The latency table header with `-D`.
pub const LAT_DURATION_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// Bytes/s in the table's unit.
pub fn bw_unit(bps: f64, gbits: bool) -> f64 {
    if gbits {
        bps * 8.0 / 1e9
    } else {
        bps / (1u64 << 20) as f64
    }
}

/// One bandwidth row.
pub fn bw_row(f: &BwFigures, gbits: bool) -> String {
    format!(
        " {:<7}    {:<7}          {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        f.size,
        f.iters,
        bw_unit(f.peak_bps, gbits),
        bw_unit(f.avg_bps, gbits),
        f.msg_rate_mpps
    )
}

/// One latency row.
pub fn lat_row(f: &LatFigures, duration: bool) -> String {
    if duration {
        format!(
            " {:<7}        {:<10}        {:<7.2}        {:<7.2}",
            f.size, f.iters, f.t_avg, f.tps
        )
    } else {
        format!(
            " {:<7} {:<7}          {:<7.2}        {:<7.2}      {:<7.2}  \t{:<7.2}     \t{:<7.2}\t\t{:<7.2}  \t\t{:<7.2}",
            f.size, f.iters, f.t_min, f.t_max, f.t_typical, f.t_avg, f.t_stdev, f.p99, f.p99_9
        )
    }
}
