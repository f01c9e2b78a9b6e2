//! A pool of slabs: page-locked CUDA host memory when a driver can be
//! loaded at run time, page-aligned host memory otherwise.
//!
//! The pool holds at most its configured number of slabs, made the first
//! time the pipeline needs one more (so a pipeline that keeps three batches in
//! circulation never pays for the fresh memory, or the page-locking, of the
//! rest), and hands out the slab returned last (its pages are the ones still
//! in the caches and the TLB). A [`SlabLease`] takes one out and returns it
//! when dropped. A batch too large for a slab gets a one-off heap buffer
//! instead (counted in the stats), so a rare outlier never fails a run.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{LoaderError, Result};
use crate::mapped::MAPPED_FROM;

/// Alignment of slabs and of every column region inside them.
pub const SLAB_ALIGN: usize = 4096;

/// How slabs should be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PinningMode {
    /// Page-locked CUDA memory when a CUDA driver and device are available,
    /// page-aligned host memory otherwise.
    #[default]
    Auto,
    /// Page-locked CUDA memory, or fail.
    Cuda,
    /// Page-aligned host memory.
    Off,
}

impl std::str::FromStr for PinningMode {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(PinningMode::Auto),
            "cuda" => Ok(PinningMode::Cuda),
            "off" => Ok(PinningMode::Off),
            other => Err(LoaderError::BadOption {
                option: "pinning",
                reason: format!("{other:?} is not one of auto, cuda, off"),
            }),
        }
    }
}

/// How the pool's slabs were actually allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning {
    /// `cuMemHostAlloc` (portable, not write-combined): page-locked, so copies
    /// to a GPU can be asynchronous.
    Cuda,
    /// Page-aligned host memory (no CUDA driver, or pinning turned off).
    PageAligned,
}

impl Pinning {
    /// `"cuda"` or `"page-aligned"`.
    pub fn name(self) -> &'static str {
        match self {
            Pinning::Cuda => "cuda",
            Pinning::PageAligned => "page-aligned",
        }
    }
}

enum Backing {
    Host(Layout),
    /// Anonymous memory mapped for this slab alone, `cap` bytes.
    Mapped(usize),
    /// A memfd's pages mapped shared, `cap` bytes, that other processes can
    /// map ([`Pool::new`]'s `share`); `id` is unique in this process.
    #[cfg(target_os = "linux")]
    Shared {
        cap: usize,
        fd: std::os::fd::OwnedFd,
        id: u64,
    },
    #[cfg(feature = "cuda")]
    Cuda(Arc<cudarc::driver::CudaContext>),
}

/// One buffer of the pool.
pub(crate) struct Slab {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: a slab is a plain owned buffer; the pointer is unique to it.
unsafe impl Send for Slab {}
// SAFETY: shared access only reads; writes need `&mut`.
unsafe impl Sync for Slab {}

impl Slab {
    fn host(len: usize) -> Result<Slab> {
        if len >= MAPPED_FROM {
            return Slab::mapped(len);
        }
        let layout = Layout::from_size_align(len.max(1), SLAB_ALIGN).map_err(|e| {
            LoaderError::BadOption {
                option: "slab_bytes",
                reason: e.to_string(),
            }
        })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| LoaderError::Io {
            op: format!("allocate a {len}-byte slab"),
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        Ok(Slab {
            ptr,
            len,
            backing: Backing::Host(layout),
        })
    }

    /// A slab of its own mapping ([`crate::mapped`]: zeroed, page-aligned):
    /// large slabs kept out of the allocator's heap, whose pages they would
    /// share with small, short-lived blocks.
    fn mapped(len: usize) -> Result<Slab> {
        let (ptr, cap) = crate::mapped::map(len).map_err(|source| LoaderError::Io {
            op: format!("allocate a {len}-byte slab"),
            source,
        })?;
        Ok(Slab {
            ptr,
            len,
            backing: Backing::Mapped(cap),
        })
    }

    /// A slab of its own memfd, mapped shared ([`crate::mapped::map_shared`]).
    #[cfg(target_os = "linux")]
    fn shared(len: usize) -> Result<Slab> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let (ptr, cap, fd) = crate::mapped::map_shared(len).map_err(|source| LoaderError::Io {
            op: format!("allocate a {len}-byte shared slab"),
            source,
        })?;
        Ok(Slab {
            ptr,
            len,
            backing: Backing::Shared {
                cap,
                fd,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            },
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda(ctx: &Arc<cudarc::driver::CudaContext>, len: usize) -> Result<Slab> {
        use cudarc::driver::{result, sys};
        let err = |e: cudarc::driver::DriverError| LoaderError::Io {
            op: format!("allocate a {len}-byte pinned slab"),
            source: std::io::Error::other(e.to_string()),
        };
        ctx.bind_to_thread().map_err(err)?;
        // Portable (usable from every context) and NOT write-combined: the
        // collator writes and frameworks may read these slabs on the CPU.
        // SAFETY: the context is current on this thread; the size is non-zero.
        let ptr = unsafe { result::malloc_host(len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(err)?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| {
            err(cudarc::driver::DriverError(
                sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            ))
        })?;
        // SAFETY: `ptr` points to `len` writable bytes.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(Slab {
            ptr,
            len,
            backing: Backing::Cuda(ctx.clone()),
        })
    }

    /// The slab's bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by this slab.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The slab's bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Capacity in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `Slab::host` with this layout.
            Backing::Host(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // SAFETY: the mapping of `cap` bytes made in `Slab::mapped`,
            // unmapped once, here.
            Backing::Mapped(cap) => unsafe { crate::mapped::unmap(self.ptr, *cap) },
            // SAFETY: the mapping of `cap` bytes made in `Slab::shared`,
            // unmapped once, here (its memfd is closed after).
            #[cfg(target_os = "linux")]
            Backing::Shared { cap, .. } => unsafe { crate::mapped::unmap(self.ptr, *cap) },
            #[cfg(feature = "cuda")]
            Backing::Cuda(ctx) => {
                if ctx.bind_to_thread().is_ok() {
                    // SAFETY: allocated by `malloc_host` and freed once.
                    let _ = unsafe { cudarc::driver::result::free_host(self.ptr.as_ptr().cast()) };
                }
            }
        }
    }
}

/// The pool: up to `size` slabs, made on first need.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    size: usize,
    /// Bytes of the slabs made from now on: raised by [`Pool::grow_for`]
    /// (a smaller slab coming back is freed, a new one made in its place).
    slab_bytes: AtomicUsize,
    /// The most bytes a slab may grow to (0: the pool does not grow).
    max_slab_bytes: usize,
    pinning: Pinning,
    /// Whether [`Pool::warm_first`] has run.
    warmed: AtomicBool,
    /// Whether slabs are made in memory other processes can map.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    share: bool,
    #[cfg(feature = "cuda")]
    ctx: Option<Arc<cudarc::driver::CudaContext>>,
    /// Slabs for batches made outside the pipeline that its slabs cannot
    /// hold ([`Pool::try_spare_for`]: a transform's outputs larger than its
    /// input, such as float32 images made from uint8 pixels): a second pool,
    /// made when first needed, remade with larger slabs when a larger
    /// output comes.
    large: Mutex<Option<Arc<Pool>>>,
    /// The most slabs that pool leases at once (0: no such pool).
    large_slabs: usize,
    /// The most bytes its slabs may take in all.
    large_bytes: u64,
}

/// What leases and the pool share: the free slabs and how many exist.
struct Shared {
    state: Mutex<Free>,
    returned: Condvar,
}

struct Free {
    /// Free slabs; the last one returned is taken first.
    slabs: Vec<Slab>,
    /// Slabs made so far (free, leased, or being made).
    made: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Free> {
        // A panic while holding the lock leaves the list consistent (pushes
        // and pops only), so a poisoned lock is used as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(feature = "cuda")]
fn cuda_context() -> Option<Arc<cudarc::driver::CudaContext>> {
    // Creating a context panics when libcuda is missing: check first.
    // SAFETY: only tries to load the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(0).ok())
        .ok()
        .flatten()
}

impl Pool {
    /// A pool of up to `size` slabs of `slab_bytes` each. One is made now
    /// (so a failure to allocate or page-lock shows here); the others the
    /// first time every slab made is leased. With `share`, slabs that are
    /// not page-locked are made in memory other processes can map
    /// ([`SlabLease::shared`]; Linux).
    pub(crate) fn new(
        size: usize,
        slab_bytes: usize,
        mode: PinningMode,
        share: bool,
    ) -> Result<Pool> {
        #[cfg(feature = "cuda")]
        let ctx = match mode {
            PinningMode::Off => None,
            _ => cuda_context(),
        };
        #[cfg(not(feature = "cuda"))]
        let ctx: Option<()> = None;
        if mode == PinningMode::Cuda && ctx.is_none() {
            return Err(LoaderError::BadOption {
                option: "pinning",
                reason: "\"cuda\" was asked for but no CUDA driver and device could be loaded"
                    .into(),
            });
        }
        let pinning = if ctx.is_some() {
            Pinning::Cuda
        } else {
            Pinning::PageAligned
        };
        let pool = Pool {
            shared: Arc::new(Shared {
                state: Mutex::new(Free {
                    slabs: Vec::with_capacity(size),
                    made: 0,
                }),
                returned: Condvar::new(),
            }),
            size,
            slab_bytes: AtomicUsize::new(slab_bytes),
            max_slab_bytes: 0,
            pinning,
            warmed: AtomicBool::new(false),
            share: share && pinning == Pinning::PageAligned && cfg!(target_os = "linux"),
            #[cfg(feature = "cuda")]
            ctx,
            large: Mutex::new(None),
            large_slabs: 0,
            large_bytes: 0,
        };
        if size > 0 {
            let slab = pool.make()?;
            let mut free = pool.shared.lock();
            free.slabs.push(slab);
            free.made = 1;
        }
        Ok(pool)
    }

    /// The pool, allowed up to `slabs` slabs larger than its own for
    /// batches made outside the pipeline, taking at most `bytes` in all
    /// ([`Pool::try_spare_for`]).
    pub(crate) fn with_large(mut self, slabs: usize, bytes: u64) -> Pool {
        self.large_slabs = slabs;
        self.large_bytes = bytes;
        self
    }

    /// The pool, whose slabs may grow to `max_slab_bytes` each for batches
    /// larger than its estimate made them ([`Pool::grow_for`]).
    pub(crate) fn with_growth(mut self, max_slab_bytes: usize) -> Pool {
        self.max_slab_bytes = max_slab_bytes;
        self
    }

    /// Make the slabs from now on hold `bytes` (rounded up to a MiB), when
    /// that stays within the pool's growth bound; whether they do. Slabs
    /// smaller than that are freed as they come back and made again at the
    /// new size, so the pool holds no more slabs than before.
    pub(crate) fn grow_for(&self, bytes: usize) -> bool {
        if bytes <= self.slab_bytes() {
            return true;
        }
        let want = bytes.div_ceil(1 << 20).saturating_mul(1 << 20);
        if want > self.max_slab_bytes {
            return false;
        }
        self.slab_bytes.fetch_max(want, Ordering::AcqRel);
        true
    }

    /// A new slab, pinned if the pool's slabs are.
    fn make(&self) -> Result<Slab> {
        let bytes = self.slab_bytes();
        #[cfg(feature = "cuda")]
        if let Some(ctx) = &self.ctx {
            return Slab::cuda(ctx, bytes);
        }
        #[cfg(target_os = "linux")]
        if self.share {
            return Slab::shared(bytes);
        }
        Slab::host(bytes)
    }

    /// A free slab of the current size from `free`, freeing smaller ones
    /// (made before the pool grew) on the way.
    fn pop_current(&self, free: &mut Free) -> Option<Slab> {
        let bytes = self.slab_bytes();
        while let Some(slab) = free.slabs.pop() {
            if slab.len() >= bytes {
                return Some(slab);
            }
            free.made -= 1;
        }
        None
    }

    /// Take a free slab (the one returned last), making one while fewer
    /// than `size` exist, else waiting for one; `None` once `cancel` is set.
    pub(crate) fn acquire(&self, cancel: &AtomicBool) -> Result<Option<SlabLease>> {
        let lease = |slab| SlabLease {
            slab: Some(slab),
            home: Some(self.shared.clone()),
        };
        let mut free = self.shared.lock();
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            if let Some(slab) = self.pop_current(&mut free) {
                return Ok(Some(lease(slab)));
            }
            if free.made < self.size {
                free.made += 1;
                drop(free);
                return match self.make() {
                    Ok(slab) => Ok(Some(lease(slab))),
                    Err(e) => {
                        self.shared.lock().made -= 1;
                        Err(e)
                    }
                };
            }
            // The timeout only bounds how late a cancel is seen.
            free = self
                .shared
                .returned
                .wait_timeout(free, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A slab for a batch made outside the pipeline (a user transform's
    /// output), without waiting: a free slab, or a new one while fewer than
    /// `size` exist, only when at least one more would still be left for
    /// the pipeline (so it can always make its next batch); else `None`.
    pub(crate) fn try_spare(&self) -> Result<Option<SlabLease>> {
        let mut free = self.shared.lock();
        let available = free.slabs.len() + self.size.saturating_sub(free.made);
        if available < 2 {
            return Ok(None);
        }
        if let Some(slab) = self.pop_current(&mut free) {
            return Ok(Some(SlabLease {
                slab: Some(slab),
                home: Some(self.shared.clone()),
            }));
        }
        free.made += 1;
        drop(free);
        match self.make() {
            Ok(slab) => Ok(Some(SlabLease {
                slab: Some(slab),
                home: Some(self.shared.clone()),
            })),
            Err(e) => {
                self.shared.lock().made -= 1;
                Err(e)
            }
        }
    }

    /// Once per pool: fault in the pages of the free slab made with it, from
    /// its start up to `bytes` (what a batch is expected to take of it), a
    /// mebibyte at a time while `waiting()` holds (the collate
    /// stage waiting for its first window). A fresh process pays for each
    /// page it first writes (~2.5 us a page on the standard machine: 39 ms of
    /// collating a first batch of 256 images into a new slab, 6 ms into a
    /// used one), so this moves part of that out of the first batch's
    /// latency. The slab stays zeroed and goes back to the pool to be taken
    /// first. Page-locked slabs are resident already. Returns the bytes whose
    /// pages were touched.
    pub(crate) fn warm_first(&self, bytes: usize, mut waiting: impl FnMut() -> bool) -> usize {
        const PAGE: usize = 4096;
        const STEP: usize = 1 << 20;
        if self.pinning == Pinning::Cuda || self.warmed.swap(true, Ordering::Relaxed) {
            return 0;
        }
        let Some(slab) = self.shared.lock().slabs.pop() else {
            return 0;
        };
        let mut lease = SlabLease {
            slab: Some(slab),
            home: Some(self.shared.clone()),
        };
        let slab = lease.slab_mut().as_mut_slice();
        let end = bytes.min(slab.len());
        let bytes = &mut slab[..end];
        let mut touched = 0;
        while touched < bytes.len() && waiting() {
            let end = touched.saturating_add(STEP).min(bytes.len());
            for page in (touched..end).step_by(PAGE) {
                // Zero over zero: the first write maps the page.
                bytes[page] = 0;
            }
            touched = end;
        }
        touched
    }

    /// [`Pool::try_spare`] for a batch of `bytes`: from the pool when its
    /// slabs hold them, else from the pool of larger slabs
    /// ([`Pool::with_large`]), made (or remade larger) now, its slabs
    /// `bytes` rounded up to a mebibyte, pinned as this pool's are; `None`
    /// when none is spare or its slabs would pass their bytes in all.
    pub(crate) fn try_spare_for(&self, bytes: usize) -> Result<Option<SlabLease>> {
        if bytes <= self.slab_bytes() {
            return self.try_spare();
        }
        let Some(want) = bytes.checked_next_multiple_of(1 << 20) else {
            return Ok(None);
        };
        // One more slab than it leases: `try_spare` keeps one back.
        let slabs = self.large_slabs.saturating_add(1);
        if self.large_slabs == 0 || (want as u64).saturating_mul(slabs as u64) > self.large_bytes {
            return Ok(None);
        }
        let pool = {
            let mut large = self.large.lock().unwrap_or_else(|e| e.into_inner());
            match &*large {
                Some(pool) if pool.slab_bytes() >= want => pool.clone(),
                _ => {
                    // The slabs of a pool replaced here are freed as their
                    // leases end.
                    let mode = match self.pinning {
                        Pinning::Cuda => PinningMode::Cuda,
                        Pinning::PageAligned => PinningMode::Off,
                    };
                    let pool = Arc::new(Pool::new(slabs, want, mode, self.share)?);
                    *large = Some(pool.clone());
                    pool
                }
            }
        };
        pool.try_spare()
    }

    /// A one-off buffer for a batch larger than a slab; freed when dropped.
    pub(crate) fn oversize(&self, bytes: usize) -> Result<SlabLease> {
        Ok(SlabLease {
            slab: Some(Slab::host(bytes)?),
            home: None,
        })
    }

    /// The most slabs the pool holds.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Slabs made so far.
    pub(crate) fn made(&self) -> usize {
        self.shared.lock().made
    }

    /// Bytes per slab.
    pub(crate) fn slab_bytes(&self) -> usize {
        self.slab_bytes.load(Ordering::Acquire)
    }

    /// How slabs were allocated.
    pub(crate) fn pinning(&self) -> Pinning {
        self.pinning
    }
}

/// A slab taken from the pool; dropping it gives the slab back.
pub struct SlabLease {
    slab: Option<Slab>,
    home: Option<Arc<Shared>>,
}

impl SlabLease {
    pub(crate) fn slab(&self) -> &Slab {
        self.slab.as_ref().expect("present until drop")
    }

    pub(crate) fn slab_mut(&mut self) -> &mut Slab {
        self.slab.as_mut().expect("present until drop")
    }

    /// Whether this lease is a one-off buffer rather than a pool slab.
    pub fn is_oversize(&self) -> bool {
        self.home.is_none()
    }

    /// The slab's address (for zero-copy views).
    pub fn as_ptr(&self) -> *const u8 {
        self.slab().ptr.as_ptr()
    }

    /// The slab's capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.slab().len()
    }

    /// For a slab other processes can map
    /// ([`crate::LoaderBuilder::shared_slabs`]):
    /// its memfd (open in this process; another process of the same user
    /// maps `/proc/<pid>/fd/<fd>`) and an id no other slab of this process
    /// has had. `None` for other slabs.
    pub fn shared(&self) -> Option<(i32, u64)> {
        match &self.slab().backing {
            #[cfg(target_os = "linux")]
            Backing::Shared { fd, id, .. } => {
                use std::os::fd::AsRawFd;
                Some((fd.as_raw_fd(), *id))
            }
            _ => None,
        }
    }
}

impl Drop for SlabLease {
    fn drop(&mut self) {
        if let (Some(slab), Some(home)) = (self.slab.take(), self.home.take()) {
            // If the pool is gone the slab is freed with the last lease.
            home.lock().slabs.push(slab);
            home.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch larger than the slabs grows them within the bound: slabs made
    /// before are freed as they come back and made again at the new size, the
    /// pool never holding more than its count; past the bound, no growth.
    #[test]
    fn slabs_grow_for_larger_batches_within_their_bound() {
        let pool = Pool::new(2, 10_000, PinningMode::Off, false)
            .unwrap()
            .with_growth(3 << 20);
        let cancel = AtomicBool::new(false);
        let small = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(small.capacity(), 10_000);
        assert!(pool.grow_for(9_000), "a batch that fits needs no growth");
        assert!(pool.grow_for((1 << 20) + 1));
        assert_eq!(pool.slab_bytes(), 2 << 20, "rounded up to a MiB");
        let big = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(big.capacity(), 2 << 20);
        assert_eq!(pool.made(), 2);
        drop(small);
        // The small slab came back: freed and made again at the new size.
        let again = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(again.capacity(), 2 << 20);
        assert_eq!(pool.made(), 2);
        assert!(!pool.grow_for((3 << 20) + 1), "past the bound");
        assert_eq!(pool.slab_bytes(), 2 << 20);
        let fixed = Pool::new(1, 10_000, PinningMode::Off, false).unwrap();
        assert!(
            !fixed.grow_for(20_000),
            "a pool without growth stays as made"
        );
    }

    #[test]
    fn slabs_are_made_on_first_need_and_the_last_returned_comes_back_first() {
        let pool = Pool::new(3, 10_000, PinningMode::Off, false).unwrap();
        assert_eq!(pool.pinning(), Pinning::PageAligned);
        assert_eq!(pool.made(), 1, "one slab is made with the pool");
        let cancel = AtomicBool::new(false);
        let a = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(pool.made(), 1);
        let b = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(
            pool.made(),
            2,
            "a second slab is made when the first is leased"
        );
        assert_eq!(a.as_ptr() as usize % SLAB_ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % SLAB_ALIGN, 0);
        assert_ne!(a.as_ptr(), b.as_ptr());
        let (first, second) = (a.as_ptr(), b.as_ptr());
        drop(a);
        drop(b);
        // Returned in the order a, b: b comes back first, then a.
        let c = pool.acquire(&cancel).unwrap().unwrap();
        let d = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!((c.as_ptr(), d.as_ptr()), (second, first));
        assert_eq!(pool.made(), 2, "free slabs are reused before one is made");
        let e = pool.acquire(&cancel).unwrap().unwrap();
        assert_eq!(pool.made(), 3);
        assert!(![first, second].contains(&e.as_ptr()));
        // All three leased: a fourth waits; a cancel ends the wait.
        let waiter = std::thread::scope(|s| {
            let h = s.spawn(|| pool.acquire(&cancel).unwrap().is_none());
            cancel.store(true, Ordering::Relaxed);
            h.join().unwrap()
        });
        assert!(waiter, "a cancelled wait gets no slab");
        assert_eq!(pool.made(), 3, "the pool never holds more than its size");
    }

    /// The first slab is warmed while the caller is waiting, once per pool,
    /// left zeroed, and comes back first; a pool whose slabs are all leased
    /// warms nothing.
    #[test]
    fn outputs_larger_than_the_slabs_get_larger_slabs_within_their_bounds() {
        let pool = Pool::new(4, 64 << 10, PinningMode::Off, false).unwrap();
        assert!(
            pool.try_spare_for(1 << 20).unwrap().is_none(),
            "no larger slabs without `with_large`"
        );
        let pool = Pool::new(4, 64 << 10, PinningMode::Off, false)
            .unwrap()
            .with_large(2, 8 << 20);
        let small = pool.try_spare_for(1000).unwrap().unwrap();
        assert_eq!(
            small.capacity(),
            64 << 10,
            "from the pool when it holds them"
        );
        let a = pool.try_spare_for(100 << 10).unwrap().unwrap();
        assert_eq!(a.capacity(), 1 << 20, "rounded up to a mebibyte");
        let b = pool.try_spare_for(10).unwrap().unwrap();
        assert_eq!(b.capacity(), 64 << 10);
        let c = pool.try_spare_for(200 << 10).unwrap().unwrap();
        assert!(
            pool.try_spare_for(200 << 10).unwrap().is_none(),
            "two larger slabs at once"
        );
        drop(c);
        let bigger = pool.try_spare_for(3 << 20).unwrap();
        assert!(
            bigger.is_none(),
            "three slabs of 3 MiB (one kept back) pass the 8 MiB"
        );
        let two = pool.try_spare_for((2 << 20) - 1).unwrap().unwrap();
        assert_eq!(
            two.capacity(),
            2 << 20,
            "a larger output remakes them larger"
        );
        drop(a);
        let again = pool.try_spare_for(100 << 10).unwrap().unwrap();
        assert_eq!(
            again.capacity(),
            2 << 20,
            "later outputs take the larger slabs"
        );
        drop((small, b, two, again));
    }

    #[test]
    fn the_first_slab_is_warmed_once_while_waiting_and_comes_back_first() {
        let pool = Pool::new(2, 4 << 20, PinningMode::Off, false).unwrap();
        let mut calls = 0;
        let touched = pool.warm_first(usize::MAX, || {
            calls += 1;
            calls <= 3
        });
        assert_eq!(touched, 3 << 20, "a mebibyte per call while waiting");
        assert_eq!(pool.warm_first(usize::MAX, || true), 0, "once per pool");
        assert_eq!(pool.made(), 1);
        let cancel = AtomicBool::new(false);
        let lease = pool.acquire(&cancel).unwrap().unwrap();
        assert!(lease.slab().as_slice().iter().all(|&b| b == 0));
        assert_eq!(pool.made(), 1, "the warmed slab is the one leased");

        let busy = Pool::new(1, 4 << 20, PinningMode::Off, false).unwrap();
        let _held = busy.acquire(&cancel).unwrap().unwrap();
        assert_eq!(
            busy.warm_first(usize::MAX, || true),
            0,
            "no free slab: nothing warmed"
        );
        // Never past the slab's end, nor past the bytes asked for.
        let whole = Pool::new(1, (4 << 20) + 100, PinningMode::Off, false).unwrap();
        assert_eq!(whole.warm_first(usize::MAX, || true), (4 << 20) + 100);
        let part = Pool::new(1, 4 << 20, PinningMode::Off, false).unwrap();
        assert_eq!(part.warm_first(1_500_000, || true), 1_500_000);
    }

    /// Slabs of 2 MiB and more are their own mappings: zeroed,
    /// aligned, writable over their whole length; smaller ones the heap's.
    #[test]
    fn large_host_slabs_are_mapped_zeroed_and_writable() {
        for len in [MAPPED_FROM - 1, MAPPED_FROM, 3 * MAPPED_FROM + 5] {
            let mut slab = Slab::host(len).unwrap();
            assert_eq!(
                matches!(slab.backing, Backing::Mapped(_)),
                len >= MAPPED_FROM,
                "{len}"
            );
            assert_eq!(slab.len(), len);
            assert_eq!(slab.as_slice().as_ptr() as usize % SLAB_ALIGN, 0);
            assert!(slab.as_slice().iter().all(|&b| b == 0));
            slab.as_mut_slice().fill(7);
            assert!(slab.as_slice().iter().all(|&b| b == 7));
        }
    }

    #[test]
    fn a_waiting_acquire_gets_the_slab_dropped_by_another_thread() {
        let pool = Pool::new(1, 4096, PinningMode::Off, false).unwrap();
        let cancel = AtomicBool::new(false);
        let a = pool.acquire(&cancel).unwrap().unwrap();
        let first = a.as_ptr() as usize;
        let got = std::thread::scope(|s| {
            let h = s.spawn(|| pool.acquire(&cancel).unwrap().unwrap().as_ptr() as usize);
            drop(a);
            h.join().unwrap()
        });
        assert_eq!(got, first);
        assert_eq!(pool.made(), 1);
    }

    /// A sharing pool's slabs each have their memfd and an id of their own
    /// (what another process maps), oversize buffers and other pools' slabs
    /// none; what the slab holds is what its memfd reads.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sharing_pool_makes_slabs_other_processes_can_map() {
        use std::io::Read;
        let pool = Pool::new(2, 8192, PinningMode::Off, true).unwrap();
        let cancel = AtomicBool::new(false);
        let mut a = pool.acquire(&cancel).unwrap().unwrap();
        let b = pool.acquire(&cancel).unwrap().unwrap();
        let (fd, id) = a.shared().unwrap();
        assert_ne!(id, b.shared().unwrap().1);
        a.slab_mut().as_mut_slice()[..5].copy_from_slice(b"batch");
        let mut seen = [0u8; 5];
        std::fs::File::open(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .read_exact(&mut seen)
            .unwrap();
        assert_eq!(&seen, b"batch");
        assert!(pool.oversize(100_000).unwrap().shared().is_none());
        let private = Pool::new(1, 8192, PinningMode::Off, false).unwrap();
        assert!(
            private
                .acquire(&cancel)
                .unwrap()
                .unwrap()
                .shared()
                .is_none()
        );
    }
}
