//! Run one scenario file and print the summary, with progress on stderr
//! every 2^16 events (for profiling: `perf record target/release/examples/profile X.toml`).
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let s = metaroce_sim::Scenario::load(std::path::Path::new(&p)).unwrap();
    let o = metaroce_sim::run_scenario(&s, None, &mut |us, left, total, ev| {
        eprintln!("{us:.3} us left {left}/{total} ev {ev}")
    })
    .unwrap();
    print!("{}", metaroce_sim::report::summary_table(&o.results));
    println!("{}", o.perf_line());
}
