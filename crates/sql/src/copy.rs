//! `COPY table [(columns)] FROM STDIN`: the statement read, and the rows of PostgreSQL's text
//! and CSV formats parsed as they stream in. The rows become INSERTs of the session's
//! transaction (see `front`), so a COPY replicates like any other write.

use crate::error::SqlError;

/// A row as COPY gives it: one text per column, None for NULL.
pub type Row = Vec<Option<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyFormat {
    /// Fields split by `delimiter`, backslash escapes, `null` (default `\N`) for NULL.
    Text { delimiter: u8, null: String },
    /// RFC 4180 with `"` quotes; an unquoted field equal to `null` (default empty) is NULL.
    Csv { delimiter: u8, null: String, header: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyIn {
    /// The table as the statement names it (quotes kept).
    pub table: String,
    /// The columns as the statement names them; empty: all, in order.
    pub columns: Vec<String>,
    pub format: CopyFormat,
}

fn unsupported(what: &str) -> SqlError {
    SqlError::unsupported(format!(
        "{what}; Chorus takes COPY table [(columns)] FROM STDIN in text or csv format"
    ))
}

/// Reads a `COPY ... FROM STDIN` statement; None if the statement is not a COPY.
pub fn parse_copy(statement: &str) -> Result<Option<CopyIn>, SqlError> {
    let words = copy_words(statement)?;
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    if upper.first().map(String::as_str) != Some("COPY") {
        return Ok(None);
    }
    let table = words
        .get(1)
        .ok_or_else(|| SqlError::syntax("COPY names no table"))?
        .clone();
    if table == "(" {
        return Err(unsupported("COPY of a query is not supported"));
    }
    let mut at = 2;
    let mut columns = Vec::new();
    if words.get(at).map(String::as_str) == Some("(") {
        at += 1;
        while let Some(word) = words.get(at) {
            at += 1;
            match word.as_str() {
                ")" => break,
                "," => {}
                name => columns.push(name.to_owned()),
            }
        }
    }
    match (upper.get(at).map(String::as_str), upper.get(at + 1).map(String::as_str)) {
        (Some("FROM"), Some("STDIN")) => at += 2,
        (Some("TO"), _) => return Err(unsupported("COPY TO is not supported")),
        (Some("FROM"), _) => return Err(unsupported("COPY FROM a file reads outside the database")),
        _ => return Err(SqlError::syntax("COPY expects FROM STDIN")),
    }
    let mut csv = false;
    let mut delimiter = None;
    let mut null = None;
    let mut header = false;
    let options = &words[at..];
    let mut i = 0;
    while i < options.len() {
        let option = options[i].to_ascii_uppercase();
        let value = options.get(i + 1).map(|v| v.trim_matches('\'').to_owned());
        match option.as_str() {
            "WITH" | "(" | ")" | "," => {}
            "CSV" => csv = true,
            "HEADER" => {
                header = !matches!(
                    value.as_deref().map(str::to_ascii_lowercase).as_deref(),
                    Some("false" | "off" | "0")
                );
                if matches!(
                    value.as_deref().map(str::to_ascii_lowercase).as_deref(),
                    Some("true" | "false" | "on" | "off" | "1" | "0")
                ) {
                    i += 1;
                }
            }
            "FORMAT" => {
                match value.as_deref().map(str::to_ascii_lowercase).as_deref() {
                    Some("csv") => csv = true,
                    Some("text") => csv = false,
                    Some(other) => return Err(unsupported(&format!("COPY format {other} is not supported"))),
                    None => return Err(SqlError::syntax("FORMAT names no format")),
                }
                i += 1;
            }
            "DELIMITER" => {
                let value = value.ok_or_else(|| SqlError::syntax("DELIMITER names no character"))?;
                let [byte] = value.as_bytes() else {
                    return Err(SqlError::new(
                        "22023",
                        "COPY delimiter must be a single one-byte character",
                    ));
                };
                delimiter = Some(*byte);
                i += 1;
            }
            "NULL" => {
                null = Some(value.ok_or_else(|| SqlError::syntax("NULL names no string"))?);
                i += 1;
            }
            other => return Err(unsupported(&format!("COPY option {other} is not supported"))),
        }
        i += 1;
    }
    let format = if csv {
        CopyFormat::Csv {
            delimiter: delimiter.unwrap_or(b','),
            null: null.unwrap_or_default(),
            header,
        }
    } else {
        if header {
            return Err(SqlError::new("0A000", "COPY HEADER is available only in CSV mode"));
        }
        CopyFormat::Text {
            delimiter: delimiter.unwrap_or(b'\t'),
            null: null.unwrap_or_else(|| "\\N".to_owned()),
        }
    };
    Ok(Some(CopyIn { table, columns, format }))
}

/// The words of a COPY statement: names and string literals (quotes kept; pieces written
/// together, as `s."t"` or `E'\t'`, are one word), and `(`, `)` and `,` as words of their own.
fn copy_words(statement: &str) -> Result<Vec<String>, SqlError> {
    let mut words: Vec<String> = Vec::new();
    let mut chars = statement.trim().trim_end_matches(';').chars().peekable();
    // Whether the next piece continues the last word (nothing between them).
    let mut joined = false;
    while let Some(&c) = chars.peek() {
        let piece = match c {
            c if c.is_whitespace() => {
                chars.next();
                joined = false;
                continue;
            }
            '(' | ')' | ',' => {
                chars.next();
                words.push(c.to_string());
                joined = false;
                continue;
            }
            '\'' | '"' => {
                let mut piece = String::from(c);
                chars.next();
                loop {
                    match chars.next() {
                        Some(q) if q == c && chars.peek() == Some(&c) => {
                            piece.push(q);
                            piece.push(q);
                            chars.next();
                        }
                        Some(q) if q == c => {
                            piece.push(q);
                            break;
                        }
                        Some(other) => piece.push(other),
                        None => return Err(SqlError::syntax("unterminated quoted string or name in COPY")),
                    }
                }
                piece
            }
            _ => {
                let mut piece = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || matches!(c, '(' | ')' | ',' | '\'' | '"') {
                        break;
                    }
                    piece.push(c);
                    chars.next();
                }
                piece
            }
        };
        match words.last_mut() {
            Some(last) if joined => last.push_str(&piece),
            _ => words.push(piece),
        }
        joined = true;
    }
    // E'\t' as a delimiter: the escape is the character itself.
    for word in &mut words {
        if word.len() > 2 && (word.starts_with("E'") || word.starts_with("e'")) && word.ends_with('\'') {
            let inner = &word[2..word.len() - 1];
            *word = format!("'{}'", unescape_text(inner)?);
        }
    }
    Ok(words)
}

/// PostgreSQL's text-format escapes: `\b \f \n \r \t \v`, octal `\NNN`, hex `\xHH`, and a
/// backslash before any other character stands for that character.
fn unescape_text(field: &str) -> Result<String, SqlError> {
    if !field.contains('\\') {
        return Ok(field.to_owned());
    }
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' || i + 1 == bytes.len() {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let next = bytes[i + 1];
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut value = u32::from(next - b'0');
                for _ in 0..2 {
                    match bytes.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(value as u8);
            }
            b'x' if bytes.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut value = 0u32;
                for _ in 0..2 {
                    match bytes.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(value as u8);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map_err(|_| SqlError::new("22021", "COPY data is not valid UTF-8"))
}

/// Rows parsed from COPY data as it arrives in pieces.
pub struct RowReader {
    format: CopyFormat,
    pending: Vec<u8>,
    header_to_skip: bool,
    /// The end-of-data marker `\.` was seen: what follows is ignored.
    ended: bool,
}

impl RowReader {
    pub fn new(format: CopyFormat) -> RowReader {
        let header_to_skip = matches!(format, CopyFormat::Csv { header: true, .. });
        RowReader {
            format,
            pending: Vec::new(),
            header_to_skip,
            ended: false,
        }
    }

    /// The rows completed by `data`.
    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<Row>, SqlError> {
        if self.ended {
            return Ok(Vec::new());
        }
        self.pending.extend_from_slice(data);
        let mut rows = Vec::new();
        let mut start = 0;
        while let Some(end) = self.record_end(start) {
            let record = self.pending[start..end].to_vec();
            start = end + 1;
            if let Some(row) = self.row(&record)? {
                rows.push(row);
            }
            if self.ended {
                break;
            }
        }
        self.pending.drain(..start);
        Ok(rows)
    }

    /// The rows left once the data is over (a last record without a newline).
    pub fn finish(&mut self) -> Result<Vec<Row>, SqlError> {
        if self.ended || self.pending.is_empty() {
            return Ok(Vec::new());
        }
        if let CopyFormat::Csv { .. } = self.format {
            if self.record_end(0).is_none() && quotes_open(&self.pending) {
                return Err(SqlError::new("22P04", "unterminated CSV quoted field"));
            }
        }
        let record = std::mem::take(&mut self.pending);
        Ok(self.row(&record)?.into_iter().collect())
    }

    /// Where the record starting at `start` ends (its newline), if it is complete.
    fn record_end(&self, start: usize) -> Option<usize> {
        let data = &self.pending[start..];
        match self.format {
            CopyFormat::Text { .. } => data.iter().position(|&b| b == b'\n').map(|p| start + p),
            CopyFormat::Csv { .. } => {
                let mut quoted = false;
                for (i, &b) in data.iter().enumerate() {
                    match b {
                        b'"' => quoted = !quoted,
                        b'\n' if !quoted => return Some(start + i),
                        _ => {}
                    }
                }
                None
            }
        }
    }

    /// One record's row; None for the header or the end marker.
    fn row(&mut self, record: &[u8]) -> Result<Option<Row>, SqlError> {
        let record = record.strip_suffix(b"\r").unwrap_or(record);
        if record == b"\\." {
            self.ended = true;
            return Ok(None);
        }
        if self.header_to_skip {
            self.header_to_skip = false;
            return Ok(None);
        }
        let text = std::str::from_utf8(record).map_err(|_| SqlError::new("22021", "COPY data is not valid UTF-8"))?;
        match &self.format {
            CopyFormat::Text { delimiter, null } => text
                .split(*delimiter as char)
                .map(|field| {
                    if field == null {
                        Ok(None)
                    } else {
                        unescape_text(field).map(Some)
                    }
                })
                .collect::<Result<Row, _>>()
                .map(Some),
            CopyFormat::Csv { delimiter, null, .. } => csv_fields(text, *delimiter as char, null).map(Some),
        }
    }
}

fn quotes_open(data: &[u8]) -> bool {
    data.iter().filter(|&&b| b == b'"').count() % 2 == 1
}

fn csv_fields(record: &str, delimiter: char, null: &str) -> Result<Row, SqlError> {
    let mut fields = Vec::new();
    let mut chars = record.chars().peekable();
    loop {
        let mut field = String::new();
        let mut quoted = false;
        if chars.peek() == Some(&'"') {
            quoted = true;
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        field.push('"');
                        chars.next();
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err(SqlError::new("22P04", "unterminated CSV quoted field")),
                }
            }
        }
        while let Some(&c) = chars.peek() {
            if c == delimiter {
                break;
            }
            field.push(c);
            chars.next();
        }
        fields.push(if !quoted && field == null { None } else { Some(field) });
        if chars.next().is_none() {
            return Ok(fields);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(null: &str) -> CopyFormat {
        CopyFormat::Text {
            delimiter: b'\t',
            null: null.into(),
        }
    }

    #[test]
    fn copy_statements_are_read_and_other_copies_refused() {
        assert_eq!(
            parse_copy("copy t (a, \"B c\") from stdin").unwrap(),
            Some(CopyIn {
                table: "t".into(),
                columns: vec!["a".into(), "\"B c\"".into()],
                format: text("\\N"),
            })
        );
        assert_eq!(
            parse_copy("COPY s.t FROM STDIN WITH (FORMAT csv, HEADER true, DELIMITER ';', NULL 'NA');").unwrap(),
            Some(CopyIn {
                table: "s.t".into(),
                columns: vec![],
                format: CopyFormat::Csv {
                    delimiter: b';',
                    null: "NA".into(),
                    header: true
                },
            })
        );
        assert_eq!(
            parse_copy("COPY t FROM STDIN CSV HEADER").unwrap().unwrap().format,
            CopyFormat::Csv {
                delimiter: b',',
                null: String::new(),
                header: true
            }
        );
        assert_eq!(
            parse_copy("COPY t FROM STDIN WITH DELIMITER E'\\t'")
                .unwrap()
                .unwrap()
                .format,
            text("\\N")
        );
        assert_eq!(parse_copy("SELECT 1").unwrap(), None);
        for refused in [
            "COPY t TO STDOUT",
            "COPY t FROM '/etc/passwd'",
            "COPY (SELECT 1) TO STDOUT",
            "COPY t FROM STDIN (FORMAT binary)",
            "COPY t FROM STDIN WITH HEADER",
        ] {
            assert!(parse_copy(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn text_rows_unescape_and_arrive_whatever_the_pieces() {
        let data = b"1\tone\\ttab\t\\N\n2\t\\x41\\101\\\\\t\n\\.\nignored\n";
        let expected = vec![
            vec![Some("1".into()), Some("one\ttab".into()), None],
            vec![Some("2".into()), Some("AA\\".into()), Some(String::new())],
        ];
        for piece in [1, 3, data.len()] {
            let mut reader = RowReader::new(text("\\N"));
            let mut rows = Vec::new();
            for chunk in data.chunks(piece) {
                rows.extend(reader.feed(chunk).unwrap());
            }
            rows.extend(reader.finish().unwrap());
            assert_eq!(rows, expected, "pieces of {piece}");
        }
    }

    #[test]
    fn csv_rows_keep_quoted_delimiters_newlines_and_empty_strings() {
        let format = CopyFormat::Csv {
            delimiter: b',',
            null: String::new(),
            header: true,
        };
        let data = b"a,b,c\r\n1,\"x, \"\"y\"\"\nz\",\r\n2,\"\",last";
        let mut reader = RowReader::new(format);
        let mut rows = reader.feed(data).unwrap();
        rows.extend(reader.finish().unwrap());
        assert_eq!(
            rows,
            vec![
                vec![Some("1".into()), Some("x, \"y\"\nz".into()), None],
                vec![Some("2".into()), Some(String::new()), Some("last".into())],
            ]
        );
        let mut open = RowReader::new(CopyFormat::Csv {
            delimiter: b',',
            null: String::new(),
            header: false,
        });
        assert!(open.feed(b"1,\"never closed\n").unwrap().is_empty());
        assert!(open.finish().is_err());
    }
}
