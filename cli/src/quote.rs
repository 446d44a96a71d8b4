//! Remote names (file names, paths) as the CLI shows them to a person: a
//! job on the remote host chooses them, so a name holding `ESC ]0;…BEL`
//! would retitle the operator's terminal and one holding `\n` would forge
//! a listing line. Quoted as GNU `ls --quoting-style=shell-escape` does:
//! plain names as they are, others in `'…'`, and any byte a terminal
//! could act on (C0, DEL, C1, Unicode line separators and bidirectional
//! or invisible format characters, bytes that are not UTF-8) as a
//! `$'…'` escape; pasted into bash, zsh or ksh the quoted form gives the
//! name's bytes back.
//!
//! Where: every listing on stdout when stdout is a terminal (`walk`,
//! `realpath`); on a pipe or a file the bytes stay exact (as `ls` does),
//! and `-0`/`--json` are exact everywhere. Messages on stderr always quote
//! the remote names they hold ([`name`]).

use std::borrow::Cow;
use std::io::IsTerminal;

/// Whether stdout is a terminal (listings are quoted then).
pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// `bytes` quoted for a message (stderr), whatever stderr is.
pub fn name(bytes: &[u8]) -> Cow<'_, str> {
    shell_escape(bytes)
}

/// `bytes` for a listing line: quoted on a terminal, exact elsewhere.
pub fn listed(bytes: &[u8], terminal: bool) -> Cow<'_, [u8]> {
    if terminal {
        match shell_escape(bytes) {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        }
    } else {
        Cow::Borrowed(bytes)
    }
}

/// Printable ASCII that needs no quoting in a shell word (as GNU's
/// shell quoting leaves alone).
fn plain_ascii(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"%+,-./:@_".contains(&b)
}

/// A character a terminal may act on or that hides or reorders text: the
/// controls (C0, DEL, C1), the line and paragraph separators, every
/// Unicode format character (`Cf`: bidirectional marks, embeddings,
/// overrides and isolates, zero-width characters, the soft hyphen, the
/// Arabic letter mark, tags) and the blank Hangul fillers (invisible
/// letters, names that look like others).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                        // soft hyphen
            | '\u{034F}'                      // combining grapheme joiner
            | '\u{0600}'..='\u{0605}'          // Arabic number signs
            | '\u{061C}'                      // Arabic letter mark (bidi)
            | '\u{06DD}' | '\u{070F}' | '\u{0890}' | '\u{0891}' | '\u{08E2}'
            | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
            | '\u{17B4}' | '\u{17B5}'          // Khmer inherent vowels (invisible)
            | '\u{180B}'..='\u{180F}'          // Mongolian selectors, vowel separator
            | '\u{200B}'..='\u{200F}'          // zero-width, LRM, RLM
            | '\u{2028}' | '\u{2029}'          // line and paragraph separators
            | '\u{202A}'..='\u{202E}'          // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}'          // word joiner, invisible operators
            | '\u{2066}'..='\u{206F}'          // bidi isolates, deprecated formats
            | '\u{FE00}'..='\u{FE0F}'          // variation selectors
            | '\u{FEFF}'                      // BOM, zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}'          // interlinear annotations
            | '\u{110BD}' | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'        // Egyptian format controls
            | '\u{1BCA0}'..='\u{1BCA3}'        // shorthand format controls
            | '\u{1D173}'..='\u{1D17A}'        // musical format controls
            | '\u{E0000}'..='\u{E0FFF}'        // tags, variation selectors supplement
        )
}

/// An agent's message (it may quote a name a job chose) for stderr: on
/// one line (`\n`, `\r` shown so), every other character of
/// [`unsafe_char`] as `\u{…}` (a C0 control as `\xNN`).
pub fn message(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && unsafe_char(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Serialized JSON for a terminal: JSON escapes C0 controls itself; every
/// other [`unsafe_char`] (DEL, C1, bidi and format characters) becomes a
/// `\uXXXX` escape too (a surrogate pair past U+FFFF). The same JSON
/// value: such characters only occur inside strings.
pub fn json_inert(json: String) -> String {
    if !json.chars().any(unsafe_char) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_char(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `bytes` in GNU `ls`'s `shell-escape` style: as they are when every byte
/// is plain (and the name is not empty), `'…'` when only shell syntax
/// needs quoting, `$'…'` when a byte must be escaped.
pub fn shell_escape(bytes: &[u8]) -> Cow<'_, str> {
    let text = std::str::from_utf8(bytes).ok();
    if let Some(s) = text {
        if !s.is_empty()
            && s.bytes().all(|b| plain_ascii(b) || b >= 0x80)
            && !s.chars().any(unsafe_char)
        {
            return Cow::Borrowed(s);
        }
        if !s.chars().any(unsafe_char) {
            // Shell syntax only: single quotes, a quote as '\''.
            return Cow::Owned(format!("'{}'", s.replace('\'', r"'\''")));
        }
    }
    // $'…': printable UTF-8 as it is, every other byte escaped.
    let mut out = String::with_capacity(bytes.len() * 2 + 3);
    out.push_str("$'");
    let mut rest = bytes;
    while !rest.is_empty() {
        let (good, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, &[][..]),
            Err(e) => {
                let (g, b) = rest.split_at(e.valid_up_to());
                // `g` is valid UTF-8: `valid_up_to` says so.
                (std::str::from_utf8(g).unwrap_or(""), b)
            }
        };
        for c in good.chars() {
            match c {
                '\\' => out.push_str(r"\\"),
                '\'' => out.push_str(r"\'"),
                '\x07' => out.push_str(r"\a"),
                '\x08' => out.push_str(r"\b"),
                '\t' => out.push_str(r"\t"),
                '\n' => out.push_str(r"\n"),
                '\x0b' => out.push_str(r"\v"),
                '\x0c' => out.push_str(r"\f"),
                '\r' => out.push_str(r"\r"),
                '\x1b' => out.push_str(r"\E"),
                c if unsafe_char(c) => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        // One byte that is not UTF-8, as octal; then go on after it.
        match bad.split_first() {
            Some((b, after)) => {
                out.push_str(&format!("\\{b:03o}"));
                rest = after;
            }
            None => rest = &[],
        }
    }
    out.push('\'');
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::shell_escape as q;

    #[test]
    fn plain_names_stay_as_they_are() {
        assert_eq!(q(b"src/main.rs"), "src/main.rs");
        assert_eq!(q(b"-n"), "-n");
        assert_eq!(q("héllo".as_bytes()), "héllo");
    }

    #[test]
    fn shell_syntax_is_single_quoted() {
        assert_eq!(q(b"a b"), "'a b'");
        assert_eq!(q(b"it's"), r"'it'\''s'");
        assert_eq!(q(b""), "''");
        assert_eq!(q(b"~x"), "'~x'");
        assert_eq!(q(b"$(id)"), "'$(id)'");
    }

    #[test]
    fn control_bytes_and_non_utf8_are_escaped() {
        assert_eq!(q(b"\x1b]0;x\x07"), r"$'\E]0;x\a'");
        assert_eq!(q(b"a\nb"), r"$'a\nb'");
        assert_eq!(q(b"\xff\xfe'\\"), r"$'\377\376\'\\'");
        assert_eq!(q("\u{9b}1m".as_bytes()), r"$'\302\2331m'");
        assert_eq!(q("a\u{202e}b".as_bytes()), r"$'a\342\200\256b'");
        assert_eq!(q("a\u{61c}b".as_bytes()), r"$'a\330\234b'");
        assert_eq!(q("soft\u{ad}hy".as_bytes()), r"$'soft\302\255hy'");
        assert_eq!(q("\u{e0041}tag".as_bytes()), r"$'\363\240\201\201tag'");
        for s in [&b"\x1b]0;x\x07"[..], b"a\nb", b"\xff\xfe'\\", b"\x7f\x00"] {
            assert!(q(s).bytes().all(|b| b >= 0x20 && b != 0x7f), "{:?}", q(s));
        }
    }
}

#[cfg(test)]
mod round_trip {
    use super::{message, shell_escape};

    /// What bash makes of the shell words `words` (`printf %s` each):
    /// their bytes, one result per word (NUL-separated).
    fn bash(words: &[String]) -> Vec<Vec<u8>> {
        let script: String = words
            .iter()
            .map(|w| format!("printf '%s\\0' {w}\n"))
            .collect();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: Vec<Vec<u8>> = out.stdout.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
        v.pop();
        v
    }

    /// Every byte 1..=255 alone, between letters, before a digit (octal
    /// escapes are exactly three digits), doubled and after a lead byte
    /// of UTF-8: bash reads each quoted name back to its bytes, and the
    /// quoted form holds no byte a terminal acts on.
    #[test]
    fn every_byte_reads_back_in_bash() {
        if std::process::Command::new("bash")
            .arg("--version")
            .output()
            .is_err()
        {
            return;
        }
        let mut names: Vec<Vec<u8>> = Vec::new();
        for b in 1u8..=255 {
            names.push(vec![b]);
            names.push(vec![b'a', b, b'b']);
            names.push(vec![b, b'7', b'7']);
            names.push(vec![b, b]);
            names.push(vec![0xc2, b]);
            names.push(vec![0xe2, 0x80, b]);
        }
        let words: Vec<String> = names.iter().map(|n| shell_escape(n).into_owned()).collect();
        for w in &words {
            assert!(
                w.chars().all(|c| !super::unsafe_char(c)),
                "{w:?} holds a character a terminal acts on"
            );
        }
        assert_eq!(bash(&words), names);
    }

    #[test]
    fn json_on_a_terminal_is_the_same_value() {
        let v = serde_json::json!({"p": "a\u{7f}\u{9b}\u{202e}\u{e0041}\n"});
        let shown = super::json_inert(v.to_string());
        assert_eq!(shown, r#"{"p":"a\u007f\u009b\u202e\udb40\udc41\n"}"#);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            v
        );
    }

    #[test]
    fn a_message_stays_on_one_line_and_inert() {
        let m =
            "cannot read a\nexecutor-client: FORGED\u{202e}gpj.exe\r\u{2028}\u{61c}\x1b]0;x\x07";
        let shown = message(m);
        assert_eq!(
            shown,
            r"cannot read a\nexecutor-client: FORGED\u{202e}gpj.exe\r\u{2028}\u{61c}\x1b]0;x\x07"
        );
        assert_eq!(message("plain é"), "plain é");
    }
}
