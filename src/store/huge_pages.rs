//! Memory for the embedded store's tables on 2 MiB pages where the kernel
//! offers them. The tables of a million keys span 141 MiB; on 4 KiB pages a
//! check over them misses the TLB on nearly every key, and on a
//! virtual machine each miss is a walk of two page tables (the guest's and
//! the host's). Measured on this project's 2-core VM, a decision over 1 M
//! keys took 0.75–0.9× the time on 2 MiB pages that it took on 4 KiB ones
//! (alternating runs; docs/performance.md, "Library").
//!
//! Linux's transparent huge pages usually run in `madvise` mode: only
//! memory a process asks for gets them. [`HugePages`] asks, for every
//! allocation of at least one huge page, and aligns it to one so that the
//! kernel can map it whole. Elsewhere, or with huge pages off, it is the
//! global allocator and nothing more.

use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};

/// The huge page size on x86-64 and (with 4 KiB base pages) aarch64.
const HUGE_PAGE: usize = 2 << 20;

/// An allocator for hash tables that may grow large: the global allocator,
/// with allocations of 2 MiB or more aligned to 2 MiB and advised to the
/// kernel as huge-page memory.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HugePages;

/// The layout `HugePages` really allocates for `layout`: the same, or for a
/// large one the same size at huge-page alignment. A pure function of the
/// request, so `deallocate` recomputes what `allocate` used.
fn placed(layout: Layout) -> Result<Layout, AllocError> {
    if layout.size() < HUGE_PAGE {
        return Ok(layout);
    }
    Layout::from_size_align(layout.size(), layout.align().max(HUGE_PAGE)).map_err(|_| AllocError)
}

// SAFETY: every block comes from `Global` with the layout `placed` gives,
// and goes back to it with the layout `placed` gives for the same request,
// which is the same; `madvise` only changes how the kernel backs the pages,
// never their contents or whether they are mapped.
unsafe impl Allocator for HugePages {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let placed = placed(layout)?;
        let block = Global.allocate(placed)?;
        if placed.size() >= HUGE_PAGE {
            advise_huge(block);
        }
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // `placed` succeeded for this layout when the block was allocated.
        if let Ok(placed) = placed(layout) {
            // SAFETY: `ptr` was allocated by `Global` with `placed` (above).
            unsafe { Global.deallocate(ptr, placed) }
        }
    }
}

/// Asks the kernel to back `block` with huge pages. Best effort: where
/// transparent huge pages are off the kernel says no, and the block stays
/// on normal pages.
#[cfg(target_os = "linux")]
fn advise_huge(block: NonNull<[u8]>) {
    let start = block.cast::<u8>().as_ptr();
    // SAFETY: the range is one block just allocated and owned by the
    // caller, starting on a huge-page (so page) boundary; MADV_HUGEPAGE
    // changes no data and unmaps nothing.
    let _ = unsafe { libc::madvise(start.cast(), block.len(), libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_block: NonNull<[u8]>) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's transparent huge page mode: `always`, `madvise` or `never`.
    #[cfg(target_os = "linux")]
    fn thp_mode() -> String {
        let path = "/sys/kernel/mm/transparent_hugepage/enabled";
        let modes = std::fs::read_to_string(path).unwrap_or_default();
        // The mode in use is the bracketed one: "always [madvise] never".
        modes
            .split_whitespace()
            .find_map(|m| m.strip_prefix('[')?.strip_suffix(']'))
            .unwrap_or("absent")
            .to_string()
    }

    /// The kB of `AnonHugePages` in the mapping of this process that holds
    /// `addr`.
    #[cfg(target_os = "linux")]
    fn huge_kb_at(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
            if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
        0
    }

    #[test]
    fn a_large_block_is_aligned_to_a_huge_page_and_a_small_one_is_not_padded() {
        let large = Layout::from_size_align(4 * HUGE_PAGE + 4096, 64).unwrap();
        let block = HugePages.allocate(large).unwrap();
        assert_eq!(block.cast::<u8>().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(block.len() >= large.size());
        unsafe { HugePages.deallocate(block.cast(), large) };

        let small = Layout::from_size_align(4096, 64).unwrap();
        assert_eq!(placed(small).unwrap(), small);
        let block = HugePages.allocate(small).unwrap();
        unsafe { HugePages.deallocate(block.cast(), small) };
    }

    /// Where the kernel offers transparent huge pages at all (`always` or
    /// `madvise`), a large table's memory is on them once touched.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_block_is_backed_by_huge_pages_where_the_kernel_offers_them() {
        let mode = thp_mode();
        let layout = Layout::from_size_align(8 * HUGE_PAGE, 64).unwrap();
        let block = HugePages.allocate(layout).unwrap();
        let start = block.cast::<u8>().as_ptr();
        // Touch every 4 KiB page, as a table filling up does.
        for page in (0..layout.size()).step_by(4096) {
            unsafe { start.add(page).write_volatile(1) };
        }
        let huge_kb = huge_kb_at(start as usize);
        unsafe { HugePages.deallocate(block.cast(), layout) };
        match mode.as_str() {
            "always" | "madvise" => assert!(
                huge_kb >= 2048,
                "THP mode {mode}: 16 MiB touched, {huge_kb} kB on huge pages"
            ),
            other => assert_eq!(
                huge_kb, 0,
                "THP mode {other:?}: the kernel gave huge pages it does not offer"
            ),
        }
    }
}
