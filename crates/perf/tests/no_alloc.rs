//! The load generator allocates nothing per message: a counting allocator watches whole runs of
//! many messages and finds only the set-up's allocations plus a few per reporting interval.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_per_message(args: &[&str], messages: fn(&lepus_perf::report::Summary) -> u64) -> (f64, u64) {
    let runtime = lepus_perf::runtime(2).unwrap();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let outcome = runtime.block_on(lepus_perf::run::run(common::mode(args))).unwrap();
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(outcome.exit_code, 0, "{:?}", outcome.summary.error);
    let count = messages(&outcome.summary);
    println!("{allocations} allocations for {count} messages");
    (allocations as f64 / count as f64, count)
}

#[test]
fn publishing_allocates_nothing_per_message() {
    // The sink confirms at once, so this is the producer path alone, with no broker needed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sink = std::thread::spawn(move || {
        let runtime = lepus_perf::runtime(1).unwrap();
        runtime.block_on(lepus_perf::sink::serve(port, std::time::Duration::from_secs(60)))
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/");
    let (per_message, count) =
        allocations_per_message(&["producer", "--url", &url, "--message-count", "200000", "--quiet", "queue://no-alloc"], |summary| {
            summary.completed
        });
    assert_eq!(count, 200_000);
    assert!(per_message < 0.01, "{per_message} allocations per published message");
    drop(sink);
}

#[test]
fn consuming_allocates_nothing_per_message() {
    let Some(broker) = common::Broker::start() else { return };
    let (per_message, count) = allocations_per_message(
        &["client", "--url", &broker.url, "--message-count", "100000", "--quiet", "queue://no-alloc-consume"],
        |summary| summary.sent + summary.received,
    );
    assert_eq!(count, 200_000);
    assert!(per_message < 0.05, "{per_message} allocations per message (sent + received)");
}
