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

/// A character a terminal may act on or that hides or reorders text.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{2028}' | '\u{2029}'            // line and paragraph separators
            | '\u{200B}'..='\u{200F}'          // zero-width, LRM, RLM
            | '\u{202A}'..='\u{202E}'          // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}'          // word joiner, invisible operators
            | '\u{2066}'..='\u{206F}'          // bidi isolates, deprecated formats
            | '\u{FEFF}'                       // BOM, zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}'          // interlinear annotations
        )
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
        for s in [&b"\x1b]0;x\x07"[..], b"a\nb", b"\xff\xfe'\\", b"\x7f\x00"] {
            assert!(q(s).bytes().all(|b| b >= 0x20 && b != 0x7f), "{:?}", q(s));
        }
    }
}
