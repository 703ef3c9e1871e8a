//! Opening the files a user names (kernel, initrd, config file) without trusting their kind.
//!
//! A FIFO opened for reading waits for a writer, and reading a character device such as
//! `/dev/zero` never ends: either would freeze the thread that opens it (the VMM thread, which
//! also answers the API, or the CLI before it prints anything). So each file is opened with
//! `O_NONBLOCK` (a FIFO opens at once) and its kind is checked with `fstat` on the descriptor
//! just opened (the same file that will be read: no window for a swap after the check).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading and checks that it is a regular file. The error says what it is
/// otherwise (`InvalidInput`).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what})"),
    ))
}

/// Reads the regular file at `path` as UTF-8 text of at most `max` bytes.
pub fn read_regular_to_string(path: &Path, max: usize) -> io::Result<String> {
    let file = open_regular(path)?;
    let mut text = String::new();
    file.take(max as u64 + 1).read_to_string(&mut text)?;
    if text.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than the limit of {max} bytes"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::time::{Duration, Instant};

    /// Issue 11, class 6: a FIFO given as a kernel, initrd or config file froze the opener
    /// (waiting for a writer); /dev/zero as a config file was read until memory ran out.
    #[test]
    fn only_regular_files_open_and_nothing_waits() {
        let dir = std::env::temp_dir().join(format!("vmm-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = Instant::now();
        let err = open_regular(&fifo).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = read_regular_to_string(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        let err = open_regular(&dir).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
        let file = dir.join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_regular_to_string(&file, 2).unwrap(), "{}");
        let err = read_regular_to_string(&file, 1).unwrap_err();
        assert!(err.to_string().contains("larger than the limit"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
