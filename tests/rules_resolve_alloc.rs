//! `RuleSet::resolve` is on every check's hot path: it may allocate the
//! counter key and nothing else. A counting allocator holds it to that.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use meridian::rules::{RuleFile, RuleSet};

struct Counting;

thread_local! {
    /// Per thread, so the test harness's other threads do not count.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (ALLOCATIONS.with(Cell::get) - before, out)
}

#[test]
fn resolve_allocates_only_the_counter_key() {
    let text = "\
domain: api
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        value: bot*
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: user
        value: vip
        rate_limit: {unit: second, requests_per_unit: 100}
      - key: user
        rate_limit: {unit: second, requests_per_unit: 10}
";
    let set = RuleSet::parse(&[RuleFile {
        name: "api.yaml".into(),
        text: text.into(),
    }])
    .expect("valid rules");
    for (value, limit) in [("vip", 100), ("bot-9", 1), ("a|b=c%", 10)] {
        let entries = [("tenant", "acme"), ("user", value)];
        let (n, resolved) = allocations_during(|| set.resolve("api", &entries));
        let resolved = resolved.expect("resolves");
        assert_eq!(resolved.rule.map(|r| r.requests_per_unit), Some(limit));
        assert_eq!(n, 1, "user={value}: only the counter key may allocate");
    }
    let (n, resolved) = allocations_during(|| set.resolve("api", &[("nobody", "x")]));
    assert!(resolved.is_none());
    assert_eq!(n, 0, "a miss allocates nothing");
}
