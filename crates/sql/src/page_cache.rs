//! SQLite's own page cache, with one of its costs taken away. Balancing a B-tree after a page
//! split swaps two pages' numbers through a temporary one, the lock page (the page holding
//! byte 2^30 of the file: page 262,145 at 4 KiB pages). The default cache (pcache1) remembers
//! the largest page number it ever held, and the end of every transaction drops the pages past
//! the database's end: if that largest number lies further past the end than the cache's hash
//! table is wide, it scans the whole table. So in a database under 1 GiB, every transaction
//! after a split scanned the hash table — a slot per cached page, ~16,000 with our cache size:
//! 5% of a TPC-C node's CPU (docs/benchmarks.md). Here the cache is pcache1 itself, handed page
//! number 0 (never a real page) for that temporary one.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

use rusqlite::ffi;

/// The byte offset SQLite locks at (`PENDING_BYTE`; never changed here): the page holding it
/// is never a database page, so a page renumbered to it is being swapped.
const LOCK_BYTE: u64 = 0x4000_0000;

/// A key pcache1 can hold that no page of SQLite's has (page numbers start at 1).
const SWAP_KEY: c_uint = 0;

/// SQLite's default page cache's methods, which every cache here delegates to.
struct Pcache1(ffi::sqlite3_pcache_methods2);

// SAFETY: the methods are plain C functions, safe to call from any thread (SQLite serializes
// a cache's calls itself); `pArg` is the default cache's and only SQLite reads it.
unsafe impl Send for Pcache1 {}
unsafe impl Sync for Pcache1 {}

static PCACHE1: OnceLock<Pcache1> = OnceLock::new();

/// Pages renumbered through the lock page since start (each swap renumbers one there and back).
static SWAPS: AtomicU64 = AtomicU64::new(0);

/// Whether `install` took effect.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// One cache: pcache1's, and the page number that stands for "being swapped" at its page size.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    lock_page: c_uint,
}

/// Installs the cache for every database this process opens from now on. Call it before any
/// thread uses SQLite (`chorus`'s main does, first thing): SQLite takes a page cache only
/// before its first connection, and its configuration must not race another thread's first
/// use. Called later, it leaves the default cache, which changes only the cost.
pub fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let mut default: ffi::sqlite3_pcache_methods2 = unsafe { std::mem::zeroed() };
        // SAFETY: GETPCACHE2 writes the methods into the struct passed.
        let got = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, &mut default as *mut _) };
        if got != ffi::SQLITE_OK || PCACHE1.set(Pcache1(default)).is_err() {
            tracing::debug!(
                code = got,
                "SQLite's page cache stays its default (SQLite was initialized)"
            );
            return;
        }
        let methods = ffi::sqlite3_pcache_methods2 {
            iVersion: 1,
            pArg: std::ptr::null_mut(),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            xCreate: Some(create),
            xCachesize: Some(cache_size),
            xPagecount: Some(page_count),
            xFetch: Some(fetch),
            xUnpin: Some(unpin),
            xRekey: Some(rekey),
            xTruncate: Some(truncate),
            xDestroy: Some(destroy),
            xShrink: Some(shrink),
        };
        // SAFETY: SQLite copies the struct; the functions live as long as the process.
        let set = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &methods as *const _) };
        if set == ffi::SQLITE_OK {
            INSTALLED.store(true, Ordering::Release);
        } else {
            tracing::debug!(
                code = set,
                "SQLite's page cache stays its default (SQLite was initialized)"
            );
        }
    });
}

/// Whether the cache here is the one SQLite uses in this process.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// How many swaps went through the lock page's number since start.
pub fn swaps() -> u64 {
    SWAPS.load(Ordering::Relaxed)
}

fn pcache1() -> &'static ffi::sqlite3_pcache_methods2 {
    &PCACHE1.get().expect("set before the cache is installed").0
}

/// SAFETY (for every function below): SQLite calls them as its page cache interface says,
/// with a cache `create` returned and not yet destroyed.
unsafe fn cache<'a>(cache: *mut ffi::sqlite3_pcache) -> &'a Cache {
    &*(cache as *const Cache)
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    let pcache1 = pcache1();
    pcache1.xInit.expect("pcache1 has xInit")(pcache1.pArg)
}

unsafe extern "C" fn shutdown(_: *mut c_void) {
    let pcache1 = pcache1();
    pcache1.xShutdown.expect("pcache1 has xShutdown")(pcache1.pArg)
}

unsafe extern "C" fn create(page_bytes: c_int, extra_bytes: c_int, purgeable: c_int) -> *mut ffi::sqlite3_pcache {
    let inner = pcache1().xCreate.expect("pcache1 has xCreate")(page_bytes, extra_bytes, purgeable);
    if inner.is_null() {
        return inner;
    }
    let lock_page = (LOCK_BYTE / page_bytes.max(1) as u64 + 1) as c_uint;
    Box::into_raw(Box::new(Cache { inner, lock_page })).cast()
}

unsafe extern "C" fn cache_size(p: *mut ffi::sqlite3_pcache, pages: c_int) {
    pcache1().xCachesize.expect("pcache1 has xCachesize")(cache(p).inner, pages)
}

unsafe extern "C" fn page_count(p: *mut ffi::sqlite3_pcache) -> c_int {
    pcache1().xPagecount.expect("pcache1 has xPagecount")(cache(p).inner)
}

unsafe extern "C" fn fetch(p: *mut ffi::sqlite3_pcache, key: c_uint, create: c_int) -> *mut ffi::sqlite3_pcache_page {
    pcache1().xFetch.expect("pcache1 has xFetch")(cache(p).inner, key, create)
}

unsafe extern "C" fn unpin(p: *mut ffi::sqlite3_pcache, page: *mut ffi::sqlite3_pcache_page, discard: c_int) {
    pcache1().xUnpin.expect("pcache1 has xUnpin")(cache(p).inner, page, discard)
}

unsafe extern "C" fn rekey(p: *mut ffi::sqlite3_pcache, page: *mut ffi::sqlite3_pcache_page, old: c_uint, new: c_uint) {
    let cache = cache(p);
    if new == cache.lock_page {
        SWAPS.fetch_add(1, Ordering::Relaxed);
    }
    let swapping = |key: c_uint| if key == cache.lock_page { SWAP_KEY } else { key };
    pcache1().xRekey.expect("pcache1 has xRekey")(cache.inner, page, swapping(old), swapping(new))
}

unsafe extern "C" fn truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    pcache1().xTruncate.expect("pcache1 has xTruncate")(cache(p).inner, limit)
}

unsafe extern "C" fn destroy(p: *mut ffi::sqlite3_pcache) {
    let cache = Box::from_raw(p as *mut Cache);
    pcache1().xDestroy.expect("pcache1 has xDestroy")(cache.inner)
}

unsafe extern "C" fn shrink(p: *mut ffi::sqlite3_pcache) {
    pcache1().xShrink.expect("pcache1 has xShrink")(cache(p).inner)
}
