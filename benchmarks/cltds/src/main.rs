//! cltds-bench IDS_FILE [--runs N] [--ticks T]
//!
//! Reads little-endian u64 ids (the pre-hashed ids bench_countmin.py writes from its
//! Workload), fills a CL-TDS sketch with one `increment` per id (T `tick_epoch`s spread
//! evenly over the stream, default 0), then times the query loop the way the crate's
//! README figures are taken: `Instant::now()`, one `sketch.query(id)` per id in stream
//! order (result through `black_box`), elapsed, ids/s. One untimed pass first, then N
//! timed passes; one line per pass and a final `CLTDS {json}` line.
use std::hint::black_box;
use std::time::Instant;

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in seconds: beside the wall
/// time, so a run on a loaded machine can be compared by the time the loop ran.
#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}
extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}
fn thread_cpu_s() -> f64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { clock_gettime(3, &mut ts) }; // 3: CLOCK_THREAD_CPUTIME_ID on Linux
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(feature = "crate")]
use cl_tds::ClTds;
#[cfg(not(feature = "crate"))]
mod model;
#[cfg(not(feature = "crate"))]
use model::ClTds;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut runs = 1usize;
    let mut ticks = 0usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--ticks" => ticks = args.next().and_then(|v| v.parse().ok()).expect("--ticks T"),
            _ => path = Some(a),
        }
    }
    let path = path.expect("usage: cltds-bench IDS_FILE [--runs N] [--ticks T]");
    let raw = std::fs::read(&path).expect("cannot read the ids file");
    assert!(raw.len() % 8 == 0, "ids file length is not a multiple of 8");
    let ids: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    drop(raw);
    let n = ids.len();

    let sketch = ClTds::new_deterministic();
    let every = if ticks > 0 { (n / (ticks + 1)).max(1) } else { usize::MAX };
    let t0 = Instant::now();
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 && i % every == 0 {
            sketch.tick_epoch();
        }
        sketch.increment(id);
    }
    let fill_s = t0.elapsed().as_secs_f64();

    let mut checksum = 0u64;
    for &id in &ids {
        checksum += sketch.query(id) as u64;
    }
    let mut rates = Vec::with_capacity(runs);
    let mut cpu_rates = Vec::with_capacity(runs);
    for r in 0..runs {
        let cpu0 = thread_cpu_s();
        let start = Instant::now();
        for &id in &ids {
            black_box(sketch.query(id));
        }
        let s = start.elapsed().as_secs_f64();
        let cpu = thread_cpu_s() - cpu0;
        let rate = n as f64 / s;
        println!("run {}: {} ids in {:.4} s ({:.4} s CPU) = {:.1} M ids/s", r, n, s, cpu, rate / 1e6);
        rates.push(rate);
        cpu_rates.push(n as f64 / cpu);
    }
    let increment_rate = n as f64 / fill_s;
    let impl_name = if cfg!(feature = "crate") { "cl-tds crate source" } else { "re-implementation (src/model.rs)" };
    println!(
        "CLTDS {{\"impl\": \"{}\", \"ids\": {}, \"query_ids_per_s\": [{}], \"query_ids_per_cpu_s\": [{}], \"increment_ids_per_s\": {:.1}, \"checksum\": {}}}",
        impl_name,
        n,
        rates.iter().map(|r| format!("{:.1}", r)).collect::<Vec<_>>().join(", "),
        cpu_rates.iter().map(|r| format!("{:.1}", r)).collect::<Vec<_>>().join(", "),
        increment_rate,
        checksum
    );
}
