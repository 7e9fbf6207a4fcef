//! The layer test's lexer: Rust source as identifiers, `::` and punctuation, with comments,
//! string, char and number literals and lifetimes dropped (enough to read paths, not to parse).

/// A token of Rust source: comments, strings and literals are dropped.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// The tokens of `src`, without comments, string, char and number literals or lifetimes.
pub(super) fn lex(src: &str) -> Vec<Tok> {
    let mut lexer = Lexer {
        c: src.chars().collect(),
        i: 0,
        out: Vec::new(),
    };
    while lexer.i < lexer.c.len() {
        lexer.step();
    }
    lexer.out
}

/// The characters, the position, and the tokens so far.
struct Lexer {
    c: Vec<char>,
    i: usize,
    out: Vec<Tok>,
}

impl Lexer {
    /// The character at `i`, `\0` past the end.
    fn at(&self, i: usize) -> char {
        self.c.get(i).copied().unwrap_or('\0')
    }

    /// Reads one token (or one thing to skip) at the position.
    fn step(&mut self) {
        let (ch, next) = (self.c[self.i], self.at(self.i + 1));
        match ch {
            _ if ch.is_whitespace() => self.i += 1,
            '/' if next == '/' => self.skip_until('\n'),
            '/' if next == '*' => self.block_comment(),
            '"' => self.i = skip_string(&self.c, self.i),
            '\'' => self.quote(),
            _ if ch.is_ascii_digit() => self.skip_ident_chars(),
            _ if ch.is_alphabetic() || ch == '_' => self.word(),
            ':' if next == ':' => {
                self.out.push(Tok::PathSep);
                self.i += 2;
            }
            _ => {
                self.out.push(Tok::Punct(ch));
                self.i += 1;
            }
        }
    }

    /// Moves to the next `end` (or the end of the source).
    fn skip_until(&mut self, end: char) {
        while self.i < self.c.len() && self.c[self.i] != end {
            self.i += 1;
        }
    }

    /// Moves past letters, digits and `_`.
    fn skip_ident_chars(&mut self) {
        while self.i < self.c.len() && (self.c[self.i].is_alphanumeric() || self.c[self.i] == '_') {
            self.i += 1;
        }
    }

    /// A `/* */` comment, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.c.len() {
            if self.c[self.i] == '/' && self.at(self.i + 1) == '*' {
                depth += 1;
                self.i += 2;
            } else if self.c[self.i] == '*' && self.at(self.i + 1) == '/' {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    break;
                }
            } else {
                self.i += 1;
            }
        }
    }

    /// After `'`: a char literal (escaped or not), or a lifetime or label.
    fn quote(&mut self) {
        if self.at(self.i + 1) == '\\' {
            self.i += 2;
            self.skip_until('\'');
            self.i += 1;
        } else if self.at(self.i + 2) == '\'' {
            self.i += 3;
        } else {
            self.i += 1;
            self.skip_ident_chars();
        }
    }

    /// A word: an identifier, or the prefix of a raw, byte or C string, a byte char or a raw
    /// identifier.
    fn word(&mut self) {
        let start = self.i;
        self.skip_ident_chars();
        let word: String = self.c[start..self.i].iter().collect();
        let (here, next) = (self.at(self.i), self.at(self.i + 1));
        let raw = matches!(word.as_str(), "r" | "br" | "cr");
        if raw && (here == '"' || (here == '#' && matches!(next, '#' | '"'))) {
            self.raw_string();
        } else if matches!(word.as_str(), "b" | "c") && here == '"' {
            self.i = skip_string(&self.c, self.i);
        } else if word == "b" && here == '\'' {
            self.byte_char();
        } else if word == "r" && here == '#' {
            self.i += 1;
            let start = self.i;
            self.skip_ident_chars();
            self.out
                .push(Tok::Ident(self.c[start..self.i].iter().collect()));
        } else {
            self.out.push(Tok::Ident(word));
        }
    }

    /// A raw string from its `#`s or opening quote: up to the quote with as many `#`s.
    fn raw_string(&mut self) {
        let mut hashes = 0;
        while self.at(self.i) == '#' {
            hashes += 1;
            self.i += 1;
        }
        self.i += 1;
        while self.i < self.c.len() {
            if self.c[self.i] == '"' && (1..=hashes).all(|k| self.at(self.i + k) == '#') {
                self.i += 1 + hashes;
                return;
            }
            self.i += 1;
        }
    }

    /// A byte char from its opening `'`.
    fn byte_char(&mut self) {
        self.i += 1;
        if self.at(self.i) == '\\' {
            self.i += 1;
        }
        self.i += 1;
        self.skip_until('\'');
        self.i += 1;
    }
}

/// The index after the string literal opening at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    i += 1;
    while i < c.len() && c[i] != '"' {
        if c[i] == '\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        lex(src)
            .into_iter()
            .filter_map(|t| match t {
                Tok::Ident(w) => Some(w),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn literals_comments_and_lifetimes_are_dropped() {
        let src = r##"a 'x' '\n' 'life b"s" c"t" b'\'' r#"u"# br"v" /* w /* x */ y */ 1_000u32 // z
            r#match d::e"##;
        assert_eq!(idents(src), ["a", "match", "d", "e"]);
        assert_eq!(
            lex("d::e;"),
            [
                Tok::Ident("d".into()),
                Tok::PathSep,
                Tok::Ident("e".into()),
                Tok::Punct(';')
            ]
        );
    }
}
