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
    for r in 0..runs {
        let start = Instant::now();
        for &id in &ids {
            black_box(sketch.query(id));
        }
        let s = start.elapsed().as_secs_f64();
        let rate = n as f64 / s;
        println!("run {}: {} ids in {:.4} s = {:.1} M ids/s", r, n, s, rate / 1e6);
        rates.push(rate);
    }
    let increment_rate = n as f64 / fill_s;
    let impl_name = if cfg!(feature = "crate") { "cl-tds crate source" } else { "re-implementation (src/model.rs)" };
    println!(
        "CLTDS {{\"impl\": \"{}\", \"ids\": {}, \"query_ids_per_s\": [{}], \"increment_ids_per_s\": {:.1}, \"checksum\": {}}}",
        impl_name,
        n,
        rates.iter().map(|r| format!("{:.1}", r)).collect::<Vec<_>>().join(", "),
        increment_rate,
        checksum
    );
}
