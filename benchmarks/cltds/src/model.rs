//! A re-implementation of CL-TDS 0.0.1 (`cl_tds::ClTds`), the parts the harness times:
//! the cell matrix and the `increment` / `query` loops, operation for operation.
//!
//! Used because crates.io as reachable from this machine has no `cl-tds` (its index
//! answers 404 for the name, and so does the crate download). Layout and loop as in
//! the crate's src/lib.rs:
//! - 4 rows x 65536 `AtomicU32` cells, each row 64-byte aligned, one zeroed box (1 MiB);
//! - a cell packs an 8-bit epoch stamp over a 24-bit count;
//! - row r's column of id is `(a[r] * id + b[r]) >> 48` (wrapping u64 arithmetic),
//!   with the crate's fixed `new_deterministic()` parameters;
//! - `query`: read the epoch (a relaxed atomic load in manual mode), then per row a
//!   relaxed load, steps = min((epoch_low - stamp) & 0xFF, 24), count >> steps (0 at
//!   24), min over the rows;
//! - `increment`: per row a relaxed load + compare_exchange_weak loop writing
//!   (epoch_low, min(decayed + 1, 2^24 - 1)).
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const WIDTH: usize = 1 << 16;
pub const DEPTH: usize = 4;
const TS_BITS: u32 = 8;
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u32 = (1 << COUNT_BITS) - 1;
const TS_MASK: u32 = (1 << TS_BITS) - 1;
const MAX_DECAY: u32 = COUNT_BITS;

const HASH_A: [u64; DEPTH] = [
    0x9e37_79b9_7f4a_7c15,
    0x517c_c1b7_2722_0a95,
    0x6c62_272e_07bb_0142,
    0xbf58_476d_1ce4_e5b9,
];
const HASH_B: [u64; DEPTH] = [
    0xd2a9_8b26_625e_ee7b,
    0x94d0_49bb_1331_11eb,
    0xc4ce_b9fe_1a85_ec53,
    0xe703_7ed1_a0b4_28db,
];

#[repr(align(64))]
pub struct Row([AtomicU32; WIDTH]);

pub struct ClTds {
    rows: Box<[Row; DEPTH]>,
    epoch: AtomicU64,
    hash_a: [u64; DEPTH],
    hash_b: [u64; DEPTH],
}

#[inline(always)]
fn steps(stamp: u32, epoch: u64) -> u32 {
    let low = (epoch & TS_MASK as u64) as u32;
    (low.wrapping_sub(stamp) & TS_MASK).min(MAX_DECAY)
}

#[inline(always)]
fn decay(count: u32, steps: u32) -> u32 {
    if steps >= MAX_DECAY {
        0
    } else {
        count >> steps
    }
}

impl ClTds {
    /// The crate's `ClTds::new_deterministic()`: manual epochs, fixed hash parameters.
    pub fn new_deterministic() -> Self {
        let rows = unsafe {
            let layout = std::alloc::Layout::new::<[Row; DEPTH]>();
            let p = std::alloc::alloc_zeroed(layout) as *mut [Row; DEPTH];
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(p)
        };
        ClTds { rows, epoch: AtomicU64::new(0), hash_a: HASH_A, hash_b: HASH_B }
    }

    #[inline(always)]
    fn current_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn col(&self, id: u64, r: usize) -> usize {
        (self.hash_a[r].wrapping_mul(id).wrapping_add(self.hash_b[r]) >> 48) as usize
    }

    pub fn increment(&self, id: u64) {
        let epoch = self.current_epoch();
        let low = (epoch & TS_MASK as u64) as u32;
        for r in 0..DEPTH {
            let cell = &self.rows[r].0[self.col(id, r)];
            loop {
                let old = cell.load(Ordering::Relaxed);
                let count = decay(old & COUNT_MASK, steps(old >> COUNT_BITS, epoch));
                let new = ((low & TS_MASK) << COUNT_BITS) | ((count + 1).min(COUNT_MASK) & COUNT_MASK);
                if cell
                    .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
            }
        }
    }

    pub fn query(&self, id: u64) -> u32 {
        let epoch = self.current_epoch();
        let mut min = u32::MAX;
        for r in 0..DEPTH {
            let v = self.rows[r].0[self.col(id, r)].load(Ordering::Relaxed);
            min = min.min(decay(v & COUNT_MASK, steps(v >> COUNT_BITS, epoch)));
        }
        min
    }

    pub fn tick_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }
}
