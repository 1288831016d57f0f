//! Tokens of the Python subset torch.fx prints.
//!
//! Tokens never span physical lines (fx never prints multi-line strings), so a token carries its
//! physical line and column directly and a statement spread over several lines is just the
//! concatenation of the lines' tokens.

use shardproof_ir::Span;

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// An identifier or keyword.
    Name(String),
    /// An integer literal, as digits (range-checked where it is used).
    Int(String),
    /// A float literal.
    Float(f64),
    /// A string literal, escapes resolved.
    Str(String),
    /// Punctuation or an operator.
    Punct(&'static str),
}

impl Tok {
    /// A short description for "found ..." in error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Name(n) => format!("`{}`", crate::excerpt(n)),
            Tok::Int(i) => format!("`{i}`"),
            Tok::Float(f) => format!("`{f}`"),
            Tok::Str(_) => "a string".to_string(),
            Tok::Punct(p) => format!("`{}`", crate::excerpt(p)),
        }
    }
}

/// A token and where it starts and ends (1-based line and columns, end exclusive).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
    pub end_col: usize,
}

impl Token {
    pub(crate) fn span(&self) -> Span {
        Span::new(self.line, self.col)
    }

    pub(crate) fn is_punct(&self, p: &str) -> bool {
        matches!(&self.tok, Tok::Punct(q) if *q == p)
    }

    pub(crate) fn is_name(&self, n: &str) -> bool {
        matches!(&self.tok, Tok::Name(m) if m == n)
    }
}

/// A lexing error: position, message, hint.
#[derive(Clone, Debug)]
pub(crate) struct LexError {
    pub span: Span,
    pub message: String,
    pub hint: Option<String>,
}

/// The punctuation token starting at `rest`, longest match first (`//` before `/`).
fn punct(rest: &[char]) -> Option<&'static str> {
    let c1 = rest.get(1).copied().unwrap_or('\0');
    let c2 = rest.get(2).copied().unwrap_or('\0');
    Some(match (rest[0], c1, c2) {
        ('*', '*', '=') => "**=",
        ('/', '/', '=') => "//=",
        ('>', '>', '=') => ">>=",
        ('<', '<', '=') => "<<=",
        ('*', '*', _) => "**",
        ('/', '/', _) => "//",
        ('=', '=', _) => "==",
        ('!', '=', _) => "!=",
        ('<', '=', _) => "<=",
        ('>', '=', _) => ">=",
        ('-', '>', _) => "->",
        ('<', '<', _) => "<<",
        ('>', '>', _) => ">>",
        ('+', '=', _) => "+=",
        ('-', '=', _) => "-=",
        ('*', '=', _) => "*=",
        ('/', '=', _) => "/=",
        ('(', _, _) => "(",
        (')', _, _) => ")",
        ('[', _, _) => "[",
        (']', _, _) => "]",
        ('{', _, _) => "{",
        ('}', _, _) => "}",
        (',', _, _) => ",",
        (':', _, _) => ":",
        (';', _, _) => ";",
        ('=', _, _) => "=",
        ('.', _, _) => ".",
        ('+', _, _) => "+",
        ('-', _, _) => "-",
        ('*', _, _) => "*",
        ('/', _, _) => "/",
        ('%', _, _) => "%",
        ('<', _, _) => "<",
        ('>', _, _) => ">",
        ('~', _, _) => "~",
        ('&', _, _) => "&",
        ('|', _, _) => "|",
        ('^', _, _) => "^",
        ('@', _, _) => "@",
        _ => return None,
    })
}

/// Lexes one physical line (without its newline). A `#` outside a string ends the line.
pub(crate) fn lex_line(text: &str, line: usize, out: &mut Vec<Token>) -> Result<(), LexError> {
    let chars: Vec<char> = text.chars().collect();
    // On ASCII lines (nearly all of them) a char index is a byte index, so names can be sliced.
    let ascii = text.is_ascii();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        if c == ' ' || c == '\t' || c == '\r' || c == '\x0c' {
            i += 1;
            continue;
        }
        if c == '#' {
            break;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name = if ascii {
                text[start..i].to_string()
            } else {
                chars[start..i].iter().collect()
            };
            out.push(Token {
                tok: Tok::Name(name),
                line,
                col,
                end_col: i + 1,
            });
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let (tok, next) = lex_number(&chars, i, line)?;
            out.push(Token {
                tok,
                line,
                col,
                end_col: next + 1,
            });
            i = next;
            continue;
        }
        if c == '\'' || c == '"' {
            let (s, next) = lex_string(&chars, i, line)?;
            out.push(Token {
                tok: Tok::Str(s),
                line,
                col,
                end_col: next + 1,
            });
            i = next;
            continue;
        }
        if let Some(p) = punct(&chars[i..]) {
            let n = p.len();
            out.push(Token {
                tok: Tok::Punct(p),
                line,
                col,
                end_col: col + n,
            });
            i += n;
            continue;
        }
        return Err(LexError {
            span: Span::new(line, col),
            message: format!("unexpected character `{}`", c.escape_debug()),
            hint: Some(
                "torch.fx readable graphs contain Python assignments of operator calls; check \
                 that the file is not corrupted"
                    .into(),
            ),
        });
    }
    Ok(())
}

fn lex_number(chars: &[char], start: usize, line: usize) -> Result<(Tok, usize), LexError> {
    let mut i = start;
    let mut is_float = false;
    while i < chars.len() && chars[i].is_ascii_digit() {
        i += 1;
    }
    if i < chars.len() && chars[i] == '.' {
        is_float = true;
        i += 1;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
        let mut j = i + 1;
        if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
            j += 1;
        }
        if j < chars.len() && chars[j].is_ascii_digit() {
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            is_float = true;
            i = j;
        } else {
            return Err(LexError {
                span: Span::new(line, i + 1),
                message: "expected digits after the exponent marker of a number".into(),
                hint: Some("numbers look like `3`, `0.1`, `1e-05` or `-10000.0`".into()),
            });
        }
    }
    if i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
        return Err(LexError {
            span: Span::new(line, start + 1),
            message: format!(
                "malformed number `{}`",
                chars[start..=i].iter().collect::<String>()
            ),
            hint: Some("numbers look like `3`, `0.1`, `1e-05` or `-10000.0`".into()),
        });
    }
    let text: String = chars[start..i].iter().collect();
    if is_float {
        // Rust's float parser is correctly rounded, like Python's, so repr() output round-trips.
        let f = text.parse::<f64>().map_err(|_| LexError {
            span: Span::new(line, start + 1),
            message: format!("malformed float `{text}`"),
            hint: None,
        })?;
        Ok((Tok::Float(f), i))
    } else {
        Ok((Tok::Int(text), i))
    }
}

fn lex_string(chars: &[char], start: usize, line: usize) -> Result<(String, usize), LexError> {
    let quote = chars[start];
    let mut s = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        let c = chars[i];
        if c == quote {
            return Ok((s, i + 1));
        }
        if c != '\\' {
            s.push(c);
            i += 1;
            continue;
        }
        let Some(&e) = chars.get(i + 1) else { break };
        i += 2;
        match e {
            '\\' => s.push('\\'),
            '\'' => s.push('\''),
            '"' => s.push('"'),
            'n' => s.push('\n'),
            't' => s.push('\t'),
            'r' => s.push('\r'),
            '0' => s.push('\0'),
            'a' => s.push('\x07'),
            'b' => s.push('\x08'),
            'f' => s.push('\x0c'),
            'v' => s.push('\x0b'),
            'x' | 'u' | 'U' => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex: String = chars[i..chars.len().min(i + n)].iter().collect();
                let code = (hex.len() == n)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32);
                match code {
                    Some(ch) => s.push(ch),
                    None => {
                        return Err(LexError {
                            span: Span::new(line, i - 1),
                            message: format!("malformed `\\{e}` escape in a string"),
                            hint: Some(format!("`\\{e}` must be followed by {n} hex digits")),
                        })
                    }
                }
                i += n;
            }
            // Python keeps unknown escapes verbatim.
            other => {
                s.push('\\');
                s.push(other);
            }
        }
    }
    Err(LexError {
        span: Span::new(line, start + 1),
        message: format!("unterminated string: expected a closing {quote} on this line"),
        hint: Some("strings in torch.fx graphs never span lines; the line may be truncated".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        let mut v = Vec::new();
        lex_line(s, 1, &mut v).unwrap();
        v.into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn lexes_numbers_strings_and_operators() {
        assert_eq!(
            toks("a // 2 ** -1e-05 'it\\'s' \"q\\n\" # comment"),
            vec![
                Tok::Name("a".into()),
                Tok::Punct("//"),
                Tok::Int("2".into()),
                Tok::Punct("**"),
                Tok::Punct("-"),
                Tok::Float(1e-05),
                Tok::Str("it's".into()),
                Tok::Str("q\n".into()),
            ]
        );
        assert_eq!(
            toks("0.17677669529663687"),
            vec![Tok::Float(0.17677669529663687)]
        );
    }

    #[test]
    fn reports_unterminated_string_at_quote() {
        let mut v = Vec::new();
        let e = lex_line("x = f('abc", 7, &mut v).unwrap_err();
        assert_eq!(e.span, Span::new(7, 7));
    }
}
