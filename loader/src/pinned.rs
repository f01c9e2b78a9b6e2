//! A fixed pool of slabs: page-locked CUDA host memory when a driver can be
//! loaded at run time, page-aligned host memory otherwise.
//!
//! Slabs are allocated once, when the pool is made, and never more: a
//! [`SlabLease`] takes one out and returns it when dropped. A batch too large
//! for a slab gets a one-off heap buffer instead (counted in the stats), so a
//! rare outlier never fails a run.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::{LoaderError, Result};

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

/// The pool: a fixed set of slabs circulating through a channel.
pub(crate) struct Pool {
    free: Receiver<Slab>,
    home: Sender<Slab>,
    size: usize,
    slab_bytes: usize,
    pinning: Pinning,
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
    /// Allocate `size` slabs of `slab_bytes` each.
    pub(crate) fn new(size: usize, slab_bytes: usize, mode: PinningMode) -> Result<Pool> {
        let (home, free) = bounded(size);
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
        for _ in 0..size {
            #[cfg(feature = "cuda")]
            let slab = match &ctx {
                Some(ctx) => Slab::cuda(ctx, slab_bytes)?,
                None => Slab::host(slab_bytes)?,
            };
            #[cfg(not(feature = "cuda"))]
            let slab = Slab::host(slab_bytes)?;
            home.send(slab).expect("the channel holds every slab");
        }
        Ok(Pool {
            free,
            home,
            size,
            slab_bytes,
            pinning,
        })
    }

    /// Take a free slab, waiting while all are leased; `None` once `cancel` is set.
    pub(crate) fn acquire(&self, cancel: &AtomicBool) -> Option<SlabLease> {
        loop {
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            if let Ok(slab) = self.free.recv_timeout(Duration::from_millis(20)) {
                return Some(SlabLease {
                    slab: Some(slab),
                    home: Some(self.home.clone()),
                });
            }
        }
    }

    /// A one-off buffer for a batch larger than a slab; freed when dropped.
    pub(crate) fn oversize(&self, bytes: usize) -> Result<SlabLease> {
        Ok(SlabLease {
            slab: Some(Slab::host(bytes)?),
            home: None,
        })
    }

    /// Slabs in the pool.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Bytes per slab.
    pub(crate) fn slab_bytes(&self) -> usize {
        self.slab_bytes
    }

    /// How slabs were allocated.
    pub(crate) fn pinning(&self) -> Pinning {
        self.pinning
    }
}

/// A slab taken from the pool; dropping it gives the slab back.
pub struct SlabLease {
    slab: Option<Slab>,
    home: Option<Sender<Slab>>,
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
}

impl Drop for SlabLease {
    fn drop(&mut self) {
        if let (Some(slab), Some(home)) = (self.slab.take(), self.home.take()) {
            // If the pool is gone the slab comes back here and is freed.
            let _ = home.send(slab);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slabs_are_aligned_and_return_to_the_pool() {
        let pool = Pool::new(2, 10_000, PinningMode::Off).unwrap();
        assert_eq!(pool.pinning(), Pinning::PageAligned);
        let cancel = AtomicBool::new(false);
        let a = pool.acquire(&cancel).unwrap();
        let b = pool.acquire(&cancel).unwrap();
        assert_eq!(a.as_ptr() as usize % SLAB_ALIGN, 0);
        assert_ne!(a.as_ptr(), b.as_ptr());
        let first = a.as_ptr();
        drop(a);
        let c = pool.acquire(&cancel).unwrap();
        assert_eq!(
            c.as_ptr(),
            first,
            "the same slab comes back: the pool never grows"
        );
        cancel.store(true, Ordering::Relaxed);
        assert!(pool.acquire(&cancel).is_none());
    }
}
