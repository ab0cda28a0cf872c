//! How the process hands memory back to the system (issue #16).
//!
//! glibc's allocator serves a large block (≥ 128 KiB) with its own `mmap`, unmapped when freed,
//! but after each such free it raises that threshold to the freed size (up to 32 MiB). After the
//! first 1 MiB `yamlContent` passes through, later ones come from the heap, which keeps them
//! after they are freed. `pullman serve` decodes each WorkOrder's payload several times: the
//! watch, validation, the queue insert. Measured with the k8s_scale `payload` scenario (100 + 100
//! WorkOrders of 900 KiB): without a fixed threshold, serve grew 54 MiB for the first 100 and
//! 50.5 KiB for each later one; with it, 13 MiB and 14.9 KiB (9.0 KiB in a run with the same
//! setting from glibc's `MALLOC_MMAP_THRESHOLD_`). Blocks under 128 KiB, which is all the queue's
//! hot path allocates, are not affected.

/// Largest allocation served from the heap; larger ones are mapped and unmapped on their own.
pub const MMAP_THRESHOLD_BYTES: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (see the module docs). Call once at
/// start-up. Does nothing with other allocators.
pub fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; no pointer is passed.
        let done =
            unsafe { nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as i32) };
        if done != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) was refused; large blocks stay in the heap");
        }
    }
}
