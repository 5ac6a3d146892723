//! The files `record` writes: checked and created before the command runs, so that a path that
//! cannot be written is reported before anything is recorded, and written without following
//! symbolic links or overwriting what belongs to somebody else.
//!
//! `Output::create` refuses a path that is a symbolic link, not a regular file, or a regular
//! file owned by another user; then it creates a new temporary file next to it
//! (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0644). `commit` writes the contents into that file and
//! `rename`s it over the path: a symbolic link planted meanwhile is replaced, never followed.
//! An output that is not committed removes its temporary file.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// One output file, created (as a temporary file) and not yet written.
pub struct Output {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

impl Output {
    /// Checks `path` and creates its temporary file; the error names the path and the reason.
    pub fn create(path: &Path) -> Result<Output, String> {
        let shown = path.display();
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "{shown} is a symbolic link: not writing through it (remove it or choose \
                     another name)"
                ))
            }
            Ok(m) if !m.is_file() => {
                return Err(format!("{shown} exists and is not a regular file"))
            }
            // SAFETY: geteuid has no preconditions.
            Ok(m) if m.uid() != unsafe { libc::geteuid() } => {
                return Err(format!(
                    "{shown} exists and belongs to uid {}: not replacing it",
                    m.uid()
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot write {shown}: {e}")),
        }
        let name = path
            .file_name()
            .ok_or_else(|| format!("{shown} is not a file name"))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".selftrace-{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| format!("cannot write {shown}: {e}"))?;
        Ok(Output {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
        })
    }

    /// Writes `contents` and renames the temporary file into place. On failure the error names
    /// the path; when only the rename failed, the contents stay in the temporary file, whose
    /// name the error gives.
    pub fn commit(mut self, contents: &[u8]) -> Result<(), String> {
        let shown = self.path.display().to_string();
        let Some(mut f) = self.file.take() else {
            return Err(format!("{shown}: written twice"));
        };
        if let Err(e) = f.write_all(contents).and_then(|()| f.sync_all()) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(format!("cannot write {shown}: {e}"));
        }
        drop(f);
        if let Err(e) = std::fs::rename(&self.tmp, &self.path) {
            let kept = self.tmp.display().to_string();
            // Keep the temporary file: it holds the recording.
            self.tmp = PathBuf::new();
            return Err(format!(
                "cannot rename the trace into {shown}: {e} (it is in {kept})"
            ));
        }
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
