//! The system streams: `MINIDUMP_SYSTEM_INFO` (CPU, `uname`) and `MINIDUMP_MISC_INFO` (pid,
//! start time, CPU times).
#![allow(unsafe_code)]

use super::file::File;
use super::streams::{Le, Stream, MISC_INFO, SYSTEM_INFO};
use super::PLATFORM_LINUX;
use crate::context::{self as arch, le32};
use crate::symbolize::FixedBuf;
use crate::sys;

/// `MINIDUMP_SYSTEM_INFO` and its CSD version string (`uname`: system, release, version,
/// machine, as Breakpad writes it).
pub(super) fn system_info(f: &mut File, chunk: &mut [u8]) -> Stream {
    // An empty name where uname fails (it does not, on Linux), as before.
    // SAFETY: all-zero is a valid utsname.
    let uts = sys::uname().unwrap_or_else(|_| unsafe { core::mem::zeroed() });
    let field = |a: &[libc::c_char]| {
        // SAFETY: c_char and u8 have the same size and alignment.
        let b = unsafe { core::slice::from_raw_parts(a.as_ptr().cast::<u8>(), a.len()) };
        &b[..sys::strnlen(b)]
    };
    let mut csd = [0u8; 4 * 65 + 4];
    let mut w = FixedBuf::new(&mut csd);
    w.push_bytes(field(&uts.sysname));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.release));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.version));
    w.push_bytes(b" ");
    w.push_bytes(field(&uts.machine));
    let n = w.len();
    let csd_rva = f.append_string(&csd[..n], chunk).rva;
    // "6.1.0-27-amd64": major, minor, build.
    let mut version = [0u32; 3];
    let mut k = 0;
    for &b in field(&uts.release) {
        match b {
            b'0'..=b'9' => {
                version[k] = version[k]
                    .saturating_mul(10)
                    .saturating_add((b - b'0') as u32)
            }
            b'.' if k < 2 => k += 1,
            _ => break,
        }
    }
    let mut cpu = [0u8; 24];
    let (level, revision) = arch::cpu_information(&mut cpu);
    let s = SystemInfo {
        arch: arch::PROCESSOR_ARCHITECTURE,
        level,
        revision,
        cpus: crate::procfs::online_cpus().min(255) as u8,
        version,
        csd_rva,
        cpu,
    }
    .encode();
    Stream {
        kind: SYSTEM_INFO,
        loc: f.append(&s),
    }
}

/// `MINIDUMP_SYSTEM_INFO`.
struct SystemInfo {
    arch: u16,
    level: u16,
    revision: u16,
    cpus: u8,
    /// Major, minor, build.
    version: [u32; 3],
    csd_rva: u32,
    /// `CPU_INFORMATION`.
    cpu: [u8; 24],
}

impl SystemInfo {
    fn encode(&self) -> [u8; 56] {
        let mut s = [0u8; 56];
        Le::new(&mut s)
            .u16(self.arch) // ProcessorArchitecture
            .u16(self.level) // ProcessorLevel
            .u16(self.revision) // ProcessorRevision
            .u8(self.cpus) // NumberOfProcessors
            .u8(0) // ProductType
            .u32(self.version[0]) // MajorVersion
            .u32(self.version[1]) // MinorVersion
            .u32(self.version[2]) // BuildNumber
            .u32(PLATFORM_LINUX) // PlatformId
            .u32(self.csd_rva) // CSDVersionRva
            .u16(0) // SuiteMask
            .u16(0) // Reserved2
            .bytes(&self.cpu); // Cpu
        s
    }
}

/// `MINIDUMP_MISC_INFO`: pid, the process's start time (Unix seconds) and its user and system
/// CPU seconds.
pub(super) fn misc_info(f: &mut File) -> Stream {
    let mut m = [0u8; 24];
    le32(&mut m, 0, 24);
    let mut flags = 1u32; // MINIDUMP_MISC1_PROCESS_ID
    le32(&mut m, 8, sys::getpid() as u32);
    if let Ok(ru) = sys::getrusage_self() {
        if let Some(start) = crate::procfs::start_time() {
            flags |= 2; // MINIDUMP_MISC1_PROCESS_TIMES
            le32(&mut m, 12, start as u32);
            le32(&mut m, 16, ru.ru_utime.tv_sec as u32);
            le32(&mut m, 20, ru.ru_stime.tv_sec as u32);
        }
    }
    le32(&mut m, 4, flags);
    Stream {
        kind: MISC_INFO,
        loc: f.append(&m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::le16;

    #[test]
    fn system_info_matches_the_literal_offsets() {
        let mut cpu = [0u8; 24];
        for (k, b) in cpu.iter_mut().enumerate() {
            *b = 0x30 + k as u8;
        }
        let r = SystemInfo {
            arch: 9,
            level: 6,
            revision: 0x5507,
            cpus: 8,
            version: [6, 1, 27],
            csd_rva: 0x1234,
            cpu,
        };
        // The encoder this replaced.
        let mut s = [0u8; 56];
        le16(&mut s, 0, r.arch);
        le16(&mut s, 2, r.level);
        le16(&mut s, 4, r.revision);
        s[6] = r.cpus;
        le32(&mut s, 8, r.version[0]);
        le32(&mut s, 12, r.version[1]);
        le32(&mut s, 16, r.version[2]);
        le32(&mut s, 20, PLATFORM_LINUX);
        le32(&mut s, 24, r.csd_rva);
        s[32..56].copy_from_slice(&cpu);
        assert_eq!(s, r.encode());
    }
}
