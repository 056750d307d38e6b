//! Prometheus histograms with fixed buckets, updated with relaxed atomics: one `fetch_add`
//! per bucket crossed is all an observation costs on the write path, and no lock is taken.
//! The store records its group commits here and the runtime its steps, activations and
//! commands; the server renders every `NamedHistogram` on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket bounds of latencies, in seconds: 50 µs to 10 s.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Bucket bounds of sizes (transitions in a group): powers of two to 4,096.
pub const SIZE_BOUNDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// A histogram: observations counted in the first bucket whose bound is at least the value
/// (the last bucket: above every bound), and their sum.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Not cumulative: one count per bucket, plus one above every bound.
    buckets: Box<[AtomicU64]>,
    /// The sum of the observations, as f64 bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// A histogram of latencies (`LATENCY_BOUNDS`, seconds).
    pub fn latency() -> Self {
        Self::new(LATENCY_BOUNDS)
    }

    /// A histogram of sizes (`SIZE_BOUNDS`).
    pub fn sizes() -> Self {
        Self::new(SIZE_BOUNDS)
    }

    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        // A compare-and-swap loop on the bits: contended only by observers of this one
        // histogram, and the write path has one observer at a time (the committer).
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    pub fn observe_duration(&self, duration: Duration) {
        self.observe(duration.as_secs_f64());
    }

    /// What it holds now: cumulative counts per bound, as Prometheus renders them.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let mut cumulative = Vec::with_capacity(self.bounds.len());
        for bucket in &self.buckets[..self.bounds.len()] {
            total += bucket.load(Ordering::Relaxed);
            cumulative.push(total);
        }
        total += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        HistogramSnapshot {
            bounds: self.bounds,
            cumulative,
            count: total,
            sum: f64::from_bits(self.sum.load(Ordering::Relaxed)),
        }
    }
}

/// A histogram as read: `cumulative[i]` observations were at most `bounds[i]`; `count` in
/// all (the `+Inf` bucket).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub bounds: &'static [f64],
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

/// A histogram with the name and help it is shown under (`openprogram_` + name), and its
/// labels (`key="value"` pairs, without braces; empty for none).
#[derive(Debug, Clone, PartialEq)]
pub struct NamedHistogram {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: String,
    pub snapshot: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        let histogram = Histogram::new(&[1.0, 2.0, 4.0]);
        for value in [0.5, 1.0, 1.5, 4.0, 9.0] {
            histogram.observe(value);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.cumulative, vec![2, 3, 4]);
        assert_eq!(snapshot.count, 5);
        assert_eq!(snapshot.sum, 16.0);
        histogram.observe_duration(Duration::from_millis(500));
        assert_eq!(histogram.snapshot().cumulative, vec![3, 4, 5]);
    }
}
