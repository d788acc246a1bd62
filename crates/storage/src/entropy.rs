//! The random numbers storage draws (a segment's nonce, a spare's or a deleted log's file name).
//! The simulator makes them a function of its seed on its own thread, so a seed replays the same
//! file names and the same checksums; everywhere else they come from the OS's generator.

/// A random `u64`: from the calling thread's seeded sequence if it installed one (tests and the
/// simulator), else from the thread's OS-seeded generator.
pub fn random_u64() -> u64 {
    #[cfg(any(test, feature = "test-support"))]
    if let Some(value) = seeded::next() {
        return value;
    }
    rand::random()
}

#[cfg(any(test, feature = "test-support"))]
pub use seeded::seed_this_thread;

#[cfg(any(test, feature = "test-support"))]
mod seeded {
    use std::cell::Cell;

    thread_local! {
        /// SplitMix64's state, when this thread installed one.
        static STATE: Cell<Option<u64>> = const { Cell::new(None) };
    }

    /// Makes [`super::random_u64`] on this thread a sequence drawn from `seed` (`None`: the OS's
    /// generator again).
    pub fn seed_this_thread(seed: Option<u64>) {
        STATE.with(|state| state.set(seed));
    }

    /// The next value of this thread's sequence (SplitMix64), if it has one.
    pub(super) fn next() -> Option<u64> {
        STATE.with(|state| {
            let current = state.get()?.wrapping_add(0x9E37_79B9_7F4A_7C15);
            state.set(Some(current));
            let mut mixed = current;
            mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            Some(mixed ^ (mixed >> 31))
        })
    }
}
