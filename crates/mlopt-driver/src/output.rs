//! Writing a compile's files into the output folder so that a reader never sees half of them, a link at
//! an output's name is replaced rather than followed, and nothing an earlier compile wrote lingers.
//!
//! Every file is written to a fresh temporary file in the folder (created exclusively, so it cannot be a
//! link someone planted), and only when all are written are they renamed into place (`rename` replaces
//! a link at the target name; it does not write through it). The files written are recorded in
//! `.mlopt-files.<name>` (one record per library, so several models compiled into one folder keep each
//! other's files), each by the SHA-256 of its contents and its name; a file the previous record of the
//! same library lists that this compile does not write is removed only if it is still a regular file
//! with those contents,
//! so a record someone planted (or an old one naming a file the user has since replaced) removes
//! nothing that is not byte for byte what a compile wrote. Other files in the folder are not touched, and
//! a compile whose output would replace one of them (a regular file it cannot prove an earlier compile
//! wrote) writes nothing and says so; names too long for a file system are refused before any write.

use crate::error::{DriverError, Result};
use mlopt_runtime::Member;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The record of what the last compile of library `name` wrote into a folder (`sha256:<hex> <file>` per
/// line): `.mlopt-files.<name>`.
fn record_name(name: &str) -> String {
    format!(".mlopt-files.{name}")
}

fn io(what: &str, p: &Path, e: impl std::fmt::Display) -> DriverError {
    DriverError::Io(format!("{what} {}: {e}", p.display()))
}

/// A plain file name: no folder part, not `.`, `..` or empty (names come from the model's name).
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Writes a file's contents into it.
pub type Writer<'a> = Box<dyn Fn(&mut std::fs::File) -> std::io::Result<()> + 'a>;

/// What goes into one output file.
pub enum Content<'a> {
    Bytes(Vec<u8>),
    /// Written by a function straight into the file: a transformer's library is hundreds of MB, not to be
    /// built in memory first.
    Stream(Writer<'a>),
}

impl std::fmt::Debug for Content<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Content::Stream(_) => f.write_str("Stream"),
        }
    }
}

/// The one record of every library older mlopt versions kept in a folder.
const LEGACY_RECORD: &str = ".mlopt-files";

/// Writes `files` (name, content) of library `name` into `dir` (made if missing) as described above;
/// returns their paths.
pub fn write_atomically(
    dir: &Path,
    name: &str,
    files: &[(String, Content)],
) -> Result<Vec<PathBuf>> {
    write_staged(dir, files, Some(name))
}

/// A folder an older mlopt wrote has one record for every library: without a record of its own, a
/// library takes that record's lines for its own files (named after it, and the report and plot,
/// which were not), so recompiling into the folder replaces what the old compile wrote and nothing
/// of another library's.
fn legacy_lines(dir: &Path, name: &str) -> String {
    let Ok(old) = std::fs::read_to_string(dir.join(LEGACY_RECORD)) else {
        return String::new();
    };
    let ours = |f: &str| {
        f == format!("lib{name}.a")
            || f.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('.'))
            || f == "report.json"
            || f == "roofline.svg"
    };
    entries(&old)
        .filter(|(_, f)| ours(f))
        .map(|(d, f)| format!("{d} {f}\n"))
        .collect()
}

/// Writes `files` into `dir` the same way (all or none, a link at a name replaced, never followed), but
/// keeps no record and removes nothing: the outputs of `run --output-dir` and `bench --profile -o`.
pub fn replace_files(dir: &Path, files: &[(String, Content)]) -> Result<Vec<PathBuf>> {
    write_staged(dir, files, None)
}

/// `write_atomically`, with the record of what was written (and the removal of what the last record
/// lists and this does not write) only for a `library` (its name).
fn write_staged(
    dir: &Path,
    files: &[(String, Content)],
    library: Option<&str>,
) -> Result<Vec<PathBuf>> {
    let keep_record = library.is_some();
    let record_file = library.map(record_name);
    let files_and_record: Vec<&str> = files
        .iter()
        .map(|(n, _)| n.as_str())
        .chain(record_file.as_deref())
        .collect();
    if let Some(name) = files_and_record.iter().find(|n| !plain(n)) {
        return Err(DriverError::Io(format!(
            "output file name {name:?} is not a plain file name"
        )));
    }
    // Checked before anything is written, so a name the file system refuses fails the whole write.
    if let Some(name) = files_and_record.iter().find(|n| n.len() > NAME_MAX) {
        return Err(DriverError::Io(format!(
            "output file name {name:?} is longer than {NAME_MAX} bytes"
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| io("creating", dir, e))?;
    let previous = match library.zip(record_file.as_ref()) {
        Some((lib, r)) => {
            std::fs::read_to_string(dir.join(r)).unwrap_or_else(|_| legacy_lines(dir, lib))
        }
        None => String::new(),
    };
    if keep_record {
        for (name, _) in files {
            shadows(dir, name, &previous)?;
        }
    }
    let mut staged = Vec::with_capacity(files.len() + 1);
    let mut record = String::new();
    let stage = |content: &Content| -> Result<tempfile::NamedTempFile> {
        let mut t = tempfile::Builder::new()
            .prefix(".mlopt-")
            .tempfile_in(dir)
            .map_err(|e| io("creating a temporary file in", dir, e))?;
        // (No fsync: this guards against a failed or interrupted compile, not a power cut, and a
        // transformer's library is hundreds of MB.)
        match content {
            Content::Bytes(b) => t.write_all(b),
            Content::Stream(write) => write(t.as_file_mut()),
        }
        .map_err(|e| io("writing", t.path(), e))?;
        set_readable(t.as_file()).map_err(|e| io("setting the mode of", t.path(), e))?;
        Ok(t)
    };
    for (name, content) in files {
        let t = stage(content)?;
        if keep_record {
            let digest = digest_of(t.path()).map_err(|e| io("reading back", t.path(), e))?;
            record.push_str(&format!("{digest} {name}\n"));
        }
        staged.push((dir.join(name), t));
    }
    if let Some(r) = record_file {
        staged.push((dir.join(r), stage(&Content::Bytes(record.into_bytes()))?));
    }
    // Everything is written: now the names change, and the previous compile's leftovers go.
    let mut written = Vec::with_capacity(files.len());
    for (i, (path, t)) in staged.into_iter().enumerate() {
        t.persist(&path)
            .map_err(|e| io("renaming into", &path, e.error))?;
        // (The record, staged last, is not one of the files.)
        if i < files.len() {
            written.push(path);
        }
    }
    // (Without a record `previous` is empty: nothing is removed.)
    for (digest, stale) in
        entries(&previous).filter(|(_, n)| plain(n) && !files.iter().any(|(f, _)| f == n))
    {
        let p = dir.join(stale);
        // symlink_metadata: a link is never followed (nor removed: no compile writes one).
        let regular = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file());
        if regular && digest_of(&p).is_ok_and(|d| d == digest) {
            std::fs::remove_file(&p).map_err(|e| io("removing the stale", &p, e))?;
        }
    }
    Ok(written)
}

/// The longest file name most file systems take, in bytes.
const NAME_MAX: usize = 255;

/// An error if writing `name` into `dir` would replace a file no compile wrote there: a file of that
/// name may be replaced only when `previous` (the last record) lists it with its current digest, or
/// when it is a link (the link is replaced; what it points to is not touched). Output names come from
/// the model, and a graph named `main` compiled into a crate's `src` would otherwise replace `main.rs`.
fn shadows(dir: &Path, name: &str, previous: &str) -> Result<()> {
    let p = dir.join(name);
    let Ok(meta) = std::fs::symlink_metadata(&p) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let ours = meta.file_type().is_file()
        && digest_of(&p).is_ok_and(|d| entries(previous).any(|e| e == (d.as_str(), name)));
    if ours {
        return Ok(());
    }
    Err(DriverError::Io(format!(
        "{} exists and is not a file an earlier compile wrote there (or it changed since): the output \
         is named after the model, so remove that file or compile into another folder",
        p.display()
    )))
}

/// A record's entries, (digest, name) per line (a line without a digest, as older records have, is none).
fn entries(record: &str) -> impl Iterator<Item = (&str, &str)> {
    record.lines().filter_map(|l| l.split_once(' '))
}

/// `sha256:` and the SHA-256 of the file at `p`, in hex.
fn digest_of(p: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(p)?, &mut h)?;
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// rw-r--r-- (a temporary file starts private to its owner; the outputs are for whoever builds with them).
fn set_readable(f: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
}

/// `mlopt_runtime::write_archive` or `write_gpu_archive`: objects -> a static library, into a file.
pub(crate) type Archive = fn(&mut std::fs::File, &[Member]) -> std::io::Result<()>;

/// Writes `files` (name, text), lib<stem>.a holding `members` by `archive`, and `extra` into `dir`, all or
/// none; returns the paths written.
pub(crate) fn write_files(
    dir: &Path,
    files: Vec<(String, String)>,
    (stem, members): (&str, &[Member]),
    archive: Archive,
    extra: &[(String, Vec<u8>)],
) -> Result<Vec<PathBuf>> {
    let mut all: Vec<(String, Content)> = files
        .into_iter()
        .map(|(n, t)| (n, Content::Bytes(t.into_bytes())))
        .collect();
    all.push((
        format!("lib{stem}.a"),
        Content::Stream(Box::new(|f: &mut std::fs::File| archive(f, members))),
    ));
    all.extend(
        extra
            .iter()
            .map(|(n, b)| (n.clone(), Content::Bytes(b.clone()))),
    );
    write_atomically(dir, stem, &all)
}
