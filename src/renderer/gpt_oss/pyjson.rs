//! Whether Python's `json.loads` accepts a text: the JSON grammar plus Python's extensions
//! (`NaN`, `Infinity`, `-Infinity`, numbers of any size, lone surrogate escapes), which
//! `serde_json` rejects.

/// `Ok(())` when Python's `json.loads(text)` succeeds; otherwise what is wrong and where.
pub(crate) fn check(text: &str) -> Result<(), String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        depth: 0,
    };
    p.ws();
    p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("Extra data: char {}", p.i));
    }
    Ok(())
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what}: char {}", self.i))
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<(), String> {
        // Python's decoder recurses too; this bound only keeps the stack safe.
        if self.depth > 10_000 {
            return self.err("Nesting too deep");
        }
        match self.s.get(self.i) {
            Some(b'{') => {
                self.depth += 1;
                self.i += 1;
                self.ws();
                if self.eat("}") {
                    self.depth -= 1;
                    return Ok(());
                }
                loop {
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err("Expecting property name enclosed in double quotes");
                    }
                    self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return self.err("Expecting ':' delimiter");
                    }
                    self.ws();
                    self.value()?;
                    self.ws();
                    if self.eat("}") {
                        break;
                    }
                    if !self.eat(",") {
                        return self.err("Expecting ',' delimiter");
                    }
                    self.ws();
                }
                self.depth -= 1;
                Ok(())
            }
            Some(b'[') => {
                self.depth += 1;
                self.i += 1;
                self.ws();
                if self.eat("]") {
                    self.depth -= 1;
                    return Ok(());
                }
                loop {
                    self.value()?;
                    self.ws();
                    if self.eat("]") {
                        break;
                    }
                    if !self.eat(",") {
                        return self.err("Expecting ',' delimiter");
                    }
                    self.ws();
                }
                self.depth -= 1;
                Ok(())
            }
            Some(b'"') => self.string(),
            _ => {
                for lit in ["null", "true", "false", "NaN", "Infinity", "-Infinity"] {
                    if self.eat(lit) {
                        return Ok(());
                    }
                }
                self.number()
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.s.get(self.i), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, the fraction and exponent only
    /// when complete (as Python's scanner: `1.` is `1` followed by extra data).
    fn number(&mut self) -> Result<(), String> {
        let start = self.i;
        self.eat("-");
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => {
                self.i = start;
                return self.err("Expecting value");
            }
        }
        let before_frac = self.i;
        if self.eat(".") && self.digits() == 0 {
            self.i = before_frac;
        }
        let before_exp = self.i;
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                self.i = before_exp;
            }
        }
        Ok(())
    }

    fn string(&mut self) -> Result<(), String> {
        self.i += 1; // opening quote
        loop {
            match self.s.get(self.i) {
                None => return self.err("Unterminated string starting at"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.s.get(self.i) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            let hex = self.s.get(self.i + 1..self.i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return self.err("Invalid \\uXXXX escape");
                            }
                            self.i += 5;
                        }
                        _ => return self.err("Invalid \\escape"),
                    }
                }
                Some(&c) if c < 0x20 => return self.err("Invalid control character at"),
                Some(_) => self.i += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn accepts_what_python_accepts() {
        for ok in [
            "{}",
            " [1, 2.5e-3, -0, \"\\ud800\", NaN, -Infinity, Infinity] ",
            "5",
            "1e400",
            "{\"a\": {\"b\": [true, false, null]}}",
            "\"é\"",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "{bad",
            "01",
            "1.",
            "[1,]",
            "{\"a\" 1}",
            "\"\t\"",
            "\"\\x\"",
            "nan",
            "{} x",
            "'a'",
            "-",
            "1e",
            "\u{feff}{}",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
