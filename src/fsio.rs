//! Durable file writes (layer 0, crate-internal except [`write_hook`]): whole files and
//! whole directories replaced atomically (temporary sibling, synced, renamed, parent
//! synced), the sweep of temporaries a killed process left behind, and the pause points a
//! crash test uses to land a `SIGKILL` inside a write.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// A function called at each pause point of a write: what is being written (`"append"`,
/// `"atomic"`, `"checkpoint"`) and the path of the file or directory.
pub type WriteHook = fn(&str, &Path);

static HOOK: OnceLock<WriteHook> = OnceLock::new();

/// Installs a function called at the pause points inside every run-directory and checkpoint
/// write (between the two halves of an appended line, before a finished temporary file is
/// renamed into place, between the files of a checkpoint directory). For crash tests: a
/// hook that announces the write and sleeps lets a test kill the process mid-write. Returns
/// `false` when a hook was already installed (it stays). Without a hook a pause point costs
/// one atomic load.
#[doc(hidden)]
pub fn set_write_hook(hook: WriteHook) -> bool {
    HOOK.set(hook).is_ok()
}

/// Calls the write hook, if one is installed.
pub(crate) fn pause_point(what: &str, path: &Path) {
    if let Some(hook) = HOOK.get() {
        hook(what, path);
    }
}

/// Writes `bytes` to `file` in one call, or, with a write hook installed, in two halves with
/// a pause point (`what`, `path`) between them, where a crash test kills the process.
pub(crate) fn write_pausing(
    file: &mut File,
    bytes: &[u8],
    what: &str,
    path: &Path,
) -> std::io::Result<()> {
    if HOOK.get().is_none() {
        return file.write_all(bytes);
    }
    let (head, tail) = bytes.split_at(bytes.len() / 2);
    file.write_all(head)?;
    pause_point(what, path);
    file.write_all(tail)
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path` and the directory synced. Readers see the old content or the new one,
/// never a mix; a crash leaves at most a hidden temporary, swept by [`sweep_stale_temps`].
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_renamed(path, bytes, true)
}

/// [`write_atomic`] without the syncs: as atomic for readers and across a process crash (the
/// page cache survives it), but after a power failure the file may be missing or empty until
/// someone syncs it ([`sync_files`]). For files written every step whose durability
/// only matters at the next checkpoint.
pub(crate) fn write_atomic_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    write_renamed(path, bytes, false)
}

fn write_renamed(path: &Path, bytes: &[u8], sync: bool) -> Result<()> {
    let tmp = temp_sibling(path, "");
    let result = (|| {
        let mut file = File::create(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
        write_pausing(&mut file, bytes, "atomic", path)
            .map_err(|e| Error::io("writing", &tmp, e))?;
        if sync {
            file.sync_all().map_err(|e| Error::io("syncing", &tmp, e))?;
        }
        drop(file);
        if sync {
            rename_into_place(&tmp, path)
        } else {
            fs::rename(&tmp, path).map_err(|e| Error::io("renaming into place", path, e))
        }
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Syncs the files at `paths` (those that still exist) and then each one's directory once.
pub(crate) fn sync_files(paths: &[PathBuf]) -> Result<()> {
    let mut dirs = std::collections::BTreeSet::new();
    for path in paths {
        match File::open(path) {
            Ok(f) => f.sync_all().map_err(|e| Error::io("syncing", path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("opening", path, e)),
        }
        if let Some(dir) = path.parent() {
            dirs.insert(dir.to_path_buf());
        }
    }
    for dir in dirs {
        sync_dir(&dir);
    }
    Ok(())
}

/// A temporary path next to `path`: `.<name>.tmp-<pid>-<n><suffix>` (hidden, unique within
/// the process). `suffix` lets writers that infer a format from the extension keep it.
pub(crate) fn temp_sibling(path: &Path, suffix: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}-{n}{suffix}", std::process::id()))
}

/// Renames a finished temporary file or directory over `path` and syncs the directory
/// (best effort: not every file system can sync a directory).
pub(crate) fn rename_into_place(tmp: &Path, path: &Path) -> Result<()> {
    fs::rename(tmp, path).map_err(|e| Error::io("renaming into place", path, e))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    Ok(())
}

/// Syncs a directory's entries to disk (best effort; a no-op where directories cannot be
/// opened as files).
pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Syncs every file of `dir` (not recursive) and then `dir` itself.
#[cfg(any(feature = "local", feature = "weights"))]
pub(crate) fn sync_files_in(dir: &Path) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        let path = entry.path();
        if path.is_file() {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io("syncing", &path, e))?;
        }
    }
    sync_dir(dir);
    Ok(())
}

/// Replaces the directory `dir` atomically: `fill` writes its files into a fresh hidden
/// temporary directory next to it, every file is synced, the old `dir` (if any) is moved
/// aside, the temporary is renamed to `dir` and the old one removed. A failure leaves `dir`
/// as it was; a crash leaves at most hidden temporaries, swept by [`sweep_stale_temps`].
#[cfg(any(feature = "local", feature = "weights"))]
pub(crate) fn write_dir_atomically(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| Error::io("creating directory", parent, e))?;
    sweep_stale_temps(parent);
    let tmp = temp_sibling(dir, "");
    fs::create_dir(&tmp).map_err(|e| Error::io("creating directory", &tmp, e))?;
    if let Err(e) = fill(&tmp).and_then(|()| {
        pause_point("checkpoint", dir);
        sync_files_in(&tmp)
    }) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = temp_sibling(dir, ".old");
    let had_old = dir.exists();
    if had_old && let Err(e) = fs::rename(dir, &old) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(Error::io("moving aside", dir, e));
    }
    if let Err(e) = rename_into_place(&tmp, dir) {
        if had_old {
            let _ = fs::rename(&old, dir);
        }
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Removes the temporaries (`.<name>.tmp-<pid>-…`, files or directories) that processes no
/// longer running left in `dir` when they were killed mid-write. Those of live processes
/// (another run writing into a shared directory) are left alone; where liveness cannot be
/// checked (no `/proc`), nothing is removed. Best effort: failures are ignored.
pub(crate) fn sweep_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let proc = Path::new("/proc/self");
    if !proc.exists() {
        return;
    }
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(&name.to_string_lossy()) else {
            continue;
        };
        if pid == me || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed a temporary left by a killed writer")
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "could not remove a stale temporary")
            }
        }
    }
}

/// The pid in a temporary's name `.<name>.tmp-<pid>-<n>[suffix]`, if it is one.
fn temp_owner(name: &str) -> Option<u32> {
    if !name.starts_with('.') {
        return None;
    }
    let (_, rest) = name.rsplit_once(".tmp-")?;
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_round_trip() {
        let t = temp_sibling(Path::new("/x/metrics.jsonl"), ".png");
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(temp_owner(&name), Some(std::process::id()));
        assert_eq!(temp_owner("metrics.jsonl"), None);
        assert_eq!(temp_owner(".hidden"), None);
        assert_eq!(temp_owner(".a.tmp-12-"), None);
        assert_eq!(temp_owner(".a.tmp-12-3.old"), Some(12));
    }

    #[test]
    fn sweep_removes_dead_writers_only() {
        let dir = std::env::temp_dir().join(format!("rlvr-fsio-sweep-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // pid 0 is never a user process: a dead writer.
        let dead_file = dir.join(".metrics.jsonl.tmp-0-1");
        let dead_dir = dir.join(".000004.tmp-0-2");
        let mine = temp_sibling(&dir.join("config.json"), "");
        fs::write(&dead_file, b"half").unwrap();
        fs::create_dir(&dead_dir).unwrap();
        fs::write(&mine, b"mine").unwrap();
        fs::write(dir.join("metrics.jsonl"), b"{}\n").unwrap();
        sweep_stale_temps(&dir);
        if Path::new("/proc/self").exists() {
            assert!(!dead_file.exists() && !dead_dir.exists());
        }
        assert!(mine.exists() && dir.join("metrics.jsonl").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[cfg(feature = "local")]
    fn directories_are_replaced_whole() {
        let root = std::env::temp_dir().join(format!("rlvr-fsio-dir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("ckpt");
        write_dir_atomically(&dir, |tmp| {
            fs::write(tmp.join("a"), b"1").map_err(|e| Error::io("writing", tmp, e))
        })
        .unwrap();
        let failed = write_dir_atomically(&dir, |tmp| {
            fs::write(tmp.join("a"), b"2").map_err(|e| Error::io("writing", tmp, e))?;
            Err(Error::Backend("disk full".into()))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(dir.join("a")).unwrap(), b"1");
        write_dir_atomically(&dir, |tmp| {
            fs::write(tmp.join("b"), b"3").map_err(|e| Error::io("writing", tmp, e))
        })
        .unwrap();
        assert!(!dir.join("a").exists());
        assert_eq!(fs::read(dir.join("b")).unwrap(), b"3");
        assert_eq!(
            fs::read_dir(&root).unwrap().count(),
            1,
            "no temporaries left"
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
