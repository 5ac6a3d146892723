//! The pprof output: a [`Profile`] as a gzipped `profile.proto`, what `go tool pprof`,
//! Pyroscope, Parca, Grafana and speedscope read.
//!
//! The messages below are those of pprof's `proto/profile.proto` (package
//! `perftools.profiles`), written by hand with `prost`'s derive so that no build script and no
//! `protoc` are needed. Only the fields selftrace writes are commented at length; the field
//! numbers and types are the proto's.
//!
//! # References
//! * <https://github.com/google/pprof/blob/main/proto/profile.proto>
//!
//! Over 600 lines because of the message definitions (about 190 lines) and the tests' fixed
//! profile (about 170): the encoder itself is about 300 lines of functions of one idea each.

use super::data::{Profile, Sample};
use std::collections::HashMap;
use std::io::{self, Write};
use std::time::UNIX_EPOCH;

/// The messages of `profile.proto`.
mod proto {
    /// `perftools.profiles.Profile`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// What each `Sample.value` means; index 0 is the count of events, by convention.
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        /// The samples.
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        /// The loaded objects; `mapping[0]` is taken for the main binary.
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        /// The locations the samples refer to.
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        /// The functions the locations' lines refer to.
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Every string of the profile; `string_table[0]` must be `""`.
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        /// A regexp of frames to drop (string index); unused.
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        /// A regexp of frames to keep (string index); unused.
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        /// When the profile began, in nanoseconds since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// How long it lasted, in nanoseconds.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        /// The kind of events between two samples.
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        /// The number of events between two samples.
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// Free text for people (string indices).
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// The preferred sample value's type (string index); 0: the last one.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
        /// A documentation link (string index); unused.
        #[prost(int64, tag = "15")]
        pub doc_url: i64,
    }

    /// `perftools.profiles.ValueType`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        /// String index of the type (`samples`, `cpu`).
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        /// String index of the unit (`count`, `nanoseconds`).
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// `perftools.profiles.Sample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Location ids, the leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        /// One value per `Profile.sample_type`.
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        /// Labels (thread name, thread id).
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// `perftools.profiles.Label`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        /// String index of the key.
        #[prost(int64, tag = "1")]
        pub key: i64,
        /// String index of a string value.
        #[prost(int64, tag = "2")]
        pub str: i64,
        /// A numeric value.
        #[prost(int64, tag = "3")]
        pub num: i64,
        /// String index of the numeric value's unit.
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// `perftools.profiles.Mapping`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// First address.
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        /// One past the last address.
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        /// The file offset of `memory_start`.
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        /// String index of the file's path.
        #[prost(int64, tag = "5")]
        pub filename: i64,
        /// String index of the build-id (lowercase hex).
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        /// The locations carry function names.
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        /// The functions carry file names.
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        /// The lines carry line numbers.
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        /// The locations carry inlined functions.
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// `perftools.profiles.Location`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// The mapping's id, 0 if none.
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        /// The instruction address.
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// The functions, innermost first: `line[i]` is inlined into `line[i + 1]`.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        /// Several symbols share this address (identical code folding).
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// `perftools.profiles.Line`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        /// The function's id.
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// The source line, 0 if unknown.
        #[prost(int64, tag = "2")]
        pub line: i64,
        /// The source column, 0 if unknown.
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    /// `perftools.profiles.Function`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        /// Nonzero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// String index of the readable name.
        #[prost(int64, tag = "2")]
        pub name: i64,
        /// String index of the system (mangled) name.
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        /// String index of the source file.
        #[prost(int64, tag = "4")]
        pub filename: i64,
        /// The function's first line, 0 if unknown.
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The string table under construction: `""` first, each string once.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    /// The index of `s`, added if new.
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Functions deduplicated by (name, system name, file), as string indices.
struct Functions {
    list: Vec<proto::Function>,
    index: HashMap<(i64, i64, i64), u64>,
}

impl Functions {
    fn id(&mut self, name: i64, system_name: i64, filename: i64) -> u64 {
        let next = self.list.len() as u64 + 1;
        let id = *self
            .index
            .entry((name, system_name, filename))
            .or_insert(next);
        if id == next {
            self.list.push(proto::Function {
                id,
                name,
                system_name,
                filename,
                start_line: 0,
            });
        }
        id
    }
}

/// A `u64` or `u128` count as protobuf's `int64`, saturating.
fn i64_of(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl Profile {
    /// The profile as pprof's `profile.proto`, gzipped: the file `go tool pprof` reads.
    ///
    /// Contents:
    /// * sample types `samples/count` and `cpu/nanoseconds` (`wall/nanoseconds` in
    ///   [`Mode::Wall`](super::Mode::Wall)); each sample's values are its count and
    ///   count × [`period_ns`](Profile::period_ns). The period type is the second one, the
    ///   period `period_ns`; the time and duration are the profile's.
    /// * each sample's labels: `thread` (the thread's name, a string) and `thread_id` (a
    ///   number).
    /// * a truncated sample ([`Sample::truncation`]) gets one more outermost frame, a function
    ///   named `[truncated: <reason>]` (the reason as [`StopReason::as_str`](crate::StopReason::as_str)
    ///   gives it), so that pprof never shows it as a complete stack.
    /// * each location with its address, its mapping and one line per function, innermost
    ///   first, as pprof wants them (a location without functions has no lines: pprof shows
    ///   its address). The address is the one to look a symbol up at
    ///   ([`Location::lookup_address`](super::Location::lookup_address)): a return address
    ///   minus one, inside the call instruction, as pprof's own profiles have it.
    /// * functions deduplicated by name, raw name and file, without a start line.
    /// * every mapping with its addresses, file offset, path and build-id (lowercase hex),
    ///   marked as symbolized (functions, file names, line numbers, inlined frames): selftrace
    ///   resolved each address while its object was loaded, so pprof must not resolve it again
    ///   against whatever file is at that path now.
    /// * a comment `dropped N samples: ring full` when [`dropped`](Profile::dropped) is not 0.
    ///
    /// The samples' location indices must be valid indices into
    /// [`locations`](Profile::locations) (a profiler's always are).
    pub fn to_pprof(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail, and the compressor has no other failure.
        self.write_pprof(&mut out)
            .expect("gzip into a Vec cannot fail");
        out
    }

    /// Writes [`to_pprof`](Profile::to_pprof)'s gzipped `profile.proto` to `w`.
    ///
    /// # Errors
    /// Those of `w`.
    pub fn write_pprof(&self, w: impl Write) -> io::Result<()> {
        use prost::Message as _;
        let encoded = self.pprof_message().encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
        gz.write_all(&encoded)?;
        gz.finish()?;
        Ok(())
    }

    /// The profile as a `perftools.profiles.Profile` message. The string table's order is the
    /// order of the calls below (sample types, mappings, locations, samples, comment): it is
    /// part of the encoded bytes.
    fn pprof_message(&self) -> proto::Profile {
        let mut strings = Strings::new();
        let mut functions = Functions {
            list: Vec::new(),
            index: HashMap::new(),
        };
        let (sample_type, time_type) = self.pprof_sample_types(&mut strings);
        let mapping = self.pprof_mappings(&mut strings);
        let mut location = self.pprof_locations(&mut strings, &mut functions);
        let sample = self.pprof_samples(&mut strings, &mut functions, &mut location);

        let mut comment = Vec::new();
        if self.dropped > 0 {
            comment.push(strings.id(&format!("dropped {} samples: ring full", self.dropped)));
        }

        proto::Profile {
            sample_type,
            sample,
            mapping,
            location,
            function: functions.list,
            string_table: strings.table,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: self
                .start
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64_of(d.as_nanos())),
            duration_nanos: i64_of(self.duration.as_nanos()),
            period_type: Some(time_type),
            period: i64_of(self.period_ns),
            comment,
            default_sample_type: 0,
            doc_url: 0,
        }
    }

    /// The two sample values (`samples/count`, then `cpu|wall/nanoseconds`), and the latter
    /// alone, which is also the period's type.
    fn pprof_sample_types(
        &self,
        strings: &mut Strings,
    ) -> (Vec<proto::ValueType>, proto::ValueType) {
        let mode = strings.id(self.mode.as_str());
        let nanoseconds = strings.id("nanoseconds");
        let time_type = proto::ValueType {
            r#type: mode,
            unit: nanoseconds,
        };
        let sample_type = vec![
            proto::ValueType {
                r#type: strings.id("samples"),
                unit: strings.id("count"),
            },
            time_type.clone(),
        ];
        (sample_type, time_type)
    }

    /// One pprof mapping per [`Mapping`], ids from 1.
    fn pprof_mappings(&self, strings: &mut Strings) -> Vec<proto::Mapping> {
        // Every mapping went through selftrace's symbolizer: see `to_pprof`'s docs.
        self.mappings
            .iter()
            .enumerate()
            .map(|(i, m)| proto::Mapping {
                id: i as u64 + 1,
                memory_start: m.start as u64,
                memory_limit: m.limit as u64,
                file_offset: m.file_offset,
                filename: strings.id(&m.path),
                build_id: match &m.build_id {
                    Some(b) => strings.id(&hex(b)),
                    None => 0,
                },
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            })
            .collect()
    }

    /// One pprof location per [`Location`], ids from 1, with its lines' functions.
    fn pprof_locations(
        &self,
        strings: &mut Strings,
        functions: &mut Functions,
    ) -> Vec<proto::Location> {
        self.locations
            .iter()
            .enumerate()
            .map(|(i, l)| proto::Location {
                id: i as u64 + 1,
                mapping_id: match l.mapping {
                    Some(m) if m < self.mappings.len() => m as u64 + 1,
                    _ => 0,
                },
                address: l.lookup_address() as u64,
                line: l
                    .lines
                    .iter()
                    .map(|line| {
                        let name = strings.id(&line.function);
                        let system_name = strings.id(&line.system_name);
                        let filename = line.file.as_deref().map_or(0, |f| strings.id(f));
                        proto::Line {
                            function_id: functions.id(name, system_name, filename),
                            line: line.line.map_or(0, i64::from),
                            column: 0,
                        }
                    })
                    .collect(),
                is_folded: false,
            })
            .collect()
    }

    /// One pprof sample per [`Sample`]: its location ids, values and thread labels. Adds to
    /// `location` the locations that the samples need beyond the profile's own: one without
    /// address for indices past `locations`, one per truncation reason.
    fn pprof_samples(
        &self,
        strings: &mut Strings,
        functions: &mut Functions,
        location: &mut Vec<proto::Location>,
    ) -> Vec<proto::Sample> {
        let thread_key = strings.id("thread");
        let thread_id_key = strings.id("thread_id");
        let mut extra = Extra {
            known: self.locations.len(),
            unknown_id: None,
            truncated: HashMap::new(),
        };
        self.samples
            .iter()
            .map(|s: &Sample| {
                let location_id = extra.location_ids(s, strings, functions, location);
                proto::Sample {
                    location_id,
                    value: vec![
                        i64_of(s.count),
                        i64_of(s.count.saturating_mul(self.period_ns)),
                    ],
                    label: vec![
                        proto::Label {
                            key: thread_key,
                            str: strings.id(&s.thread_name),
                            num: 0,
                            num_unit: 0,
                        },
                        proto::Label {
                            key: thread_id_key,
                            str: 0,
                            num: i64::from(s.thread_id),
                            num_unit: 0,
                        },
                    ],
                }
            })
            .collect()
    }
}

/// The locations that samples add to the profile's own, each made once, when first needed.
struct Extra {
    /// How many locations the profile has: an index past them is an unknown frame.
    known: usize,
    /// The one location without address or lines that every unknown frame refers to.
    unknown_id: Option<u64>,
    /// One location per truncation reason, a function of its own with no address.
    truncated: HashMap<&'static str, u64>,
}

impl Extra {
    /// A sample's location ids, innermost first, with its truncation (if any) as the
    /// outermost.
    fn location_ids(
        &mut self,
        s: &Sample,
        strings: &mut Strings,
        functions: &mut Functions,
        location: &mut Vec<proto::Location>,
    ) -> Vec<u64> {
        let mut location_id: Vec<u64> = Vec::with_capacity(s.locations.len() + 1);
        for &l in &s.locations {
            if l < self.known {
                location_id.push(l as u64 + 1);
                continue;
            }
            // A location index past `locations` (a profile built by hand) refers to one
            // location without address or lines: an unknown frame, as pprof shows one.
            let id = *self.unknown_id.get_or_insert_with(|| {
                let id = location.len() as u64 + 1;
                location.push(proto::Location {
                    id,
                    mapping_id: 0,
                    address: 0,
                    line: Vec::new(),
                    is_folded: false,
                });
                id
            });
            location_id.push(id);
        }
        if let Some(t) = s.truncation {
            let reason = t.reason.as_str();
            let id = *self.truncated.entry(reason).or_insert_with(|| {
                let name = strings.id(&format!("[truncated: {reason}]"));
                let id = location.len() as u64 + 1;
                location.push(proto::Location {
                    id,
                    mapping_id: 0,
                    address: 0,
                    line: vec![proto::Line {
                        function_id: functions.id(name, 0, 0),
                        line: 0,
                        column: 0,
                    }],
                    is_folded: false,
                });
                id
            });
            location_id.push(id);
        }
        location_id
    }
}

/// Lowercase hex, as pprof and `file(1)` print build-ids.
fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_start_empty_and_are_unique() {
        let mut s = Strings::new();
        assert_eq!(s.id(""), 0);
        assert_eq!(s.id("cpu"), 1);
        assert_eq!(s.id("nanoseconds"), 2);
        assert_eq!(s.id("cpu"), 1);
        assert_eq!(s.table, ["", "cpu", "nanoseconds"]);
    }

    /// A hand-built profile that reaches every part of the message: two mappings (one with a
    /// build-id), inlined lines with and without files, an exact and a return address, a
    /// location index past `locations`, two truncation reasons, dropped samples.
    fn fixed_profile() -> Profile {
        use crate::profile::{Line, Location, Mapping, Mode, Sample};
        use crate::symbolize::FrameKind;
        use crate::unwind::{StopReason, Truncation};
        use std::sync::Arc;
        use std::time::Duration;
        let line = |f: &str, sys: &str, file: Option<&str>, n: Option<u32>| Line {
            function: Arc::from(f),
            system_name: Arc::from(sys),
            file: file.map(Arc::from),
            line: n,
        };
        Profile {
            mode: Mode::Wall,
            frequency_hz: 99,
            period_ns: 1_000_000_000 / 99,
            start: UNIX_EPOCH + Duration::from_nanos(1_733_000_000_123_456_789),
            duration: Duration::from_millis(1_500),
            samples: vec![
                Sample {
                    locations: vec![0, 1, 2],
                    count: 7,
                    thread_id: 101,
                    thread_name: Arc::from("main"),
                    truncation: None,
                },
                Sample {
                    locations: vec![1, 9],
                    count: 3,
                    thread_id: 102,
                    thread_name: Arc::from("worker-1"),
                    truncation: Some(Truncation {
                        pc: 0x2000,
                        reason: StopReason::TooDeep,
                    }),
                },
                Sample {
                    locations: vec![2, 9],
                    count: u64::MAX,
                    thread_id: 103,
                    thread_name: Arc::from("main"),
                    truncation: Some(Truncation {
                        pc: 0x3000,
                        reason: StopReason::NoUnwindRule,
                    }),
                },
            ],
            locations: vec![
                Location {
                    address: 0x1010,
                    kind: FrameKind::Exact,
                    mapping: Some(0),
                    lines: vec![
                        line("inner", "_ZN5inner17h0E", Some("src/a.rs"), Some(12)),
                        line("outer", "outer", Some("src/a.rs"), Some(40)),
                    ],
                },
                Location {
                    address: 0x7f00_0000_2345,
                    kind: FrameKind::Return,
                    mapping: Some(1),
                    lines: vec![line("lib_fn", "", None, None)],
                },
                Location {
                    address: 0x5000,
                    kind: FrameKind::Return,
                    mapping: Some(7),
                    lines: Vec::new(),
                },
            ],
            mappings: vec![
                Mapping {
                    start: 0x1000,
                    limit: 0x9000,
                    file_offset: 0x1000,
                    path: Arc::from("/usr/bin/prog"),
                    build_id: Some(vec![0xde, 0xad, 0x0b, 0xef]),
                },
                Mapping {
                    start: 0x7f00_0000_0000,
                    limit: 0x7f00_0010_0000,
                    file_offset: 0,
                    path: Arc::from("/lib/libc.so.6"),
                    build_id: None,
                },
            ],
            dropped: 5,
        }
    }

    /// FNV-1a, to pin the encoded bytes in one number.
    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// The message's bytes for a fixed profile, as the encoder gave them when it was one
    /// function: splitting or reordering the encoder must not change them.
    #[test]
    fn message_bytes_are_pinned() {
        use prost::Message as _;
        let bytes = fixed_profile().pprof_message().encode_to_vec();
        assert_eq!(
            (bytes.len(), fnv(&bytes)),
            (GOLDEN_LEN, GOLDEN_FNV),
            "{bytes:02x?}"
        );
    }

    const GOLDEN_LEN: usize = 564;
    const GOLDEN_FNV: u64 = 8_696_774_228_403_499_083;

    #[test]
    fn build_ids_are_lowercase_hex() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(hex(&[]), "");
    }
}
