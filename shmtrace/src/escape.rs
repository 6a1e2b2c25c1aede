//! Every string that comes from a traced process (comm, file names, paths,
//! command lines) is escaped before it reaches a terminal or a file: a
//! hostile name must not move the cursor, forge a line, or break JSON.

/// Bytes up to the first NUL, escaped: printable ASCII and valid non-control
/// UTF-8 pass through; `\` becomes `\\`; anything else becomes `\xNN`.
pub fn bytes(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let raw = &raw[..end];
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() || is_bidi_or_invisible(c) => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Escapes an already-decoded string the same way.
pub fn str(s: &str) -> String {
    bytes(s.as_bytes())
}

/// Characters that reorder or hide text on a terminal (Trojan Source).
fn is_bidi_or_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_invalid_utf8_and_backslash() {
        assert_eq!(bytes(b"torch_1_2\0junk"), "torch_1_2");
        assert_eq!(bytes(b"a\nb"), "a\\x0ab");
        assert_eq!(bytes(b"\x1b[31mred"), "\\x1b[31mred");
        assert_eq!(bytes(b"back\\slash"), "back\\\\slash");
        assert_eq!(bytes(b"\xff\xfe"), "\\xff\\xfe");
        assert_eq!(bytes("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(str("x\u{202e}y"), "x\\xe2\\x80\\xaey");
    }

    #[test]
    fn names_that_could_forge_a_line_or_a_terminal_sequence_are_defused() {
        // A newline, an escape sequence and a quote in a file name.
        let e = bytes(b"x\n\x1b[2J\"}");
        assert!(!e.contains('\n') && !e.contains('\x1b'), "{e}");
        assert_eq!(e, r#"x\x0a\x1b[2J"}"#);
        // Valid UTF-8 stays readable; a backslash is doubled.
        assert_eq!(str("réseau"), "réseau");
        assert_eq!(str(r"a\b"), r"a\\b");
        // Bidi overrides cannot reorder what a terminal shows.
        assert_eq!(str("a\u{202e}b"), r"a\xe2\x80\xaeb");
    }
}
