//! The flame-graph output: a [`Profile`]'s folded stacks drawn by inferno's port of
//! `flamegraph.pl`, an interactive SVG (hover for counts, click to zoom, Ctrl-F to search).

use super::data::{Mode, Profile};
use std::io::{self, Write};

impl Profile {
    /// Writes the profile as an SVG flame graph to `w`: one tower per thread (the thread's
    /// name at the bottom), callers below callees, each frame as wide as the samples whose stack
    /// contains it, as [`folded`](Profile::folded) gives them (inlined functions are frames of
    /// their own, a truncated stack has a `[truncated: <reason>]` frame under its outermost
    /// known function). The title says CPU or wall-clock time and the frequency.
    ///
    /// A profile without samples gives a small valid SVG that says "no samples".
    ///
    /// # Errors
    /// Those of `w`; `InvalidData` when the counts add up to more than `u64::MAX`.
    pub fn write_flamegraph(&self, mut w: impl Write) -> io::Result<()> {
        let title = self.flamegraph_title();
        // Counts that add up past u64::MAX (a profile built by hand) cannot be drawn.
        if self
            .samples
            .iter()
            .try_fold(0u64, |t, s| t.checked_add(s.count))
            .is_none()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the sample counts add up to more than u64::MAX",
            ));
        }
        let total = self.total();
        if total == 0 {
            return w.write_all(message_svg(&title, "no samples").as_bytes());
        }
        let folded = self.folded();
        let mut options = inferno::flamegraph::Options::default();
        options.title = title;
        options.subtitle = Some(if self.dropped > 0 {
            format!("{total} samples; {} more dropped (ring full)", self.dropped)
        } else {
            format!("{total} samples")
        });
        options.count_name = "samples".to_owned();
        // Colors from the names, not random: the same profile gives the same file.
        options.hash = true;
        options.deterministic = true;
        inferno::flamegraph::from_lines(&mut options, folded.lines(), w)
    }

    /// [`write_flamegraph`](Profile::write_flamegraph)'s SVG in memory. Should inferno refuse
    /// the stacks, the SVG says so (with its error) instead of drawing a graph.
    pub fn flamegraph_svg(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.write_flamegraph(&mut out) {
            Ok(()) => out,
            Err(e) => {
                message_svg(&self.flamegraph_title(), &format!("no flame graph: {e}")).into_bytes()
            }
        }
    }

    /// `CPU profile, 99 Hz` or `Wall-clock profile, 99 Hz`.
    fn flamegraph_title(&self) -> String {
        let what = match self.mode {
            Mode::Cpu => "CPU",
            Mode::Wall => "Wall-clock",
        };
        format!("{what} profile, {} Hz", self.frequency_hz)
    }
}

/// A small SVG with a title and one line of text.
fn message_svg(title: &str, text: &str) -> String {
    format!(
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"90\" viewBox=\"0 0 1200 90\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#eeeeee\"/>\n",
            "<text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"17\">{}</text>\n",
            "<text x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" ",
            "font-size=\"12\">{}</text>\n",
            "</svg>\n"
        ),
        escape(title),
        escape(text)
    )
}

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_xml_specials() {
        assert_eq!(
            escape("<a & 'b' \"c\">"),
            "&lt;a &amp; &apos;b&apos; &quot;c&quot;&gt;"
        );
    }
}
