//! Built-in preprocessors: opaque payloads, CSV records and SQL statements. (Key-value commands
//! have theirs in the kv crate, which knows their layout.)
//!
//! Each one splits a command into parts whose concatenation rules its `recreate` knows, keeping
//! the original bytes exactly: a CSV record keeps its quoting, a SQL statement its spacing and
//! case. Input it does not understand becomes one verbatim part.

use bytes::Bytes;

use crate::cache::Fnv;
use crate::{varint_part, Error, Part, PartReader, Preprocessor};

/// The whole command as one cacheable item (worthwhile when entire commands recur).
#[derive(Debug, Clone, Default)]
pub struct OpaquePreprocessor;

impl Preprocessor for OpaquePreprocessor {
    fn preprocess(&self, command: &Bytes, parts: &mut Vec<Part>) {
        parts.push(Part::Cacheable(command.clone()));
    }

    fn recreate(&self, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
        out.extend_from_slice(parts.next_part()?);
        Ok(())
    }

    fn fingerprint(&self) -> u64 {
        1
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Verbatim,
    Cacheable,
    /// Split on this byte; every piece is cacheable (e.g. the words of a subject line).
    Split(u8),
}

/// CSV records (RFC 4180 quoting): chosen columns are cacheable, others verbatim, and a column
/// may be split into cacheable pieces.
#[derive(Debug, Clone)]
pub struct CsvPreprocessor {
    delimiter: u8,
    columns: Vec<Column>,
}

impl CsvPreprocessor {
    /// `cacheable`: column numbers (from 0) whose values recur; `split`: columns split into
    /// pieces at a separator byte.
    pub fn new(delimiter: u8, cacheable: &[usize], split: &[(usize, u8)]) -> CsvPreprocessor {
        let width = cacheable
            .iter()
            .copied()
            .chain(split.iter().map(|(c, _)| *c))
            .max()
            .map_or(0, |m| m + 1);
        let mut columns = vec![Column::Verbatim; width];
        for c in cacheable {
            columns[*c] = Column::Cacheable;
        }
        for (c, sep) in split {
            columns[*c] = Column::Split(*sep);
        }
        CsvPreprocessor { delimiter, columns }
    }

    fn column(&self, i: usize) -> Column {
        self.columns.get(i).copied().unwrap_or(Column::Verbatim)
    }

    /// Byte ranges of the fields: split at delimiters outside double quotes.
    fn fields(&self, record: &[u8]) -> Vec<(usize, usize)> {
        let mut fields = Vec::with_capacity(self.columns.len().max(4));
        let mut start = 0;
        let mut quoted = false;
        for (i, &b) in record.iter().enumerate() {
            if b == b'"' {
                quoted = !quoted;
            } else if b == self.delimiter && !quoted {
                fields.push((start, i));
                start = i + 1;
            }
        }
        fields.push((start, record.len()));
        fields
    }
}

impl Preprocessor for CsvPreprocessor {
    fn preprocess(&self, command: &Bytes, parts: &mut Vec<Part>) {
        let fields = self.fields(command);
        parts.push(varint_part(fields.len() as u64));
        for (i, (start, end)) in fields.into_iter().enumerate() {
            let field = command.slice(start..end);
            match self.column(i) {
                Column::Verbatim => parts.push(Part::Verbatim(field)),
                Column::Cacheable => parts.push(Part::Cacheable(field)),
                Column::Split(sep) => {
                    let pieces: Vec<Bytes> = field.split(|b| *b == sep).map(|piece| field.slice_ref(piece)).collect();
                    parts.push(varint_part(pieces.len() as u64));
                    parts.extend(pieces.into_iter().map(Part::Cacheable));
                }
            }
        }
    }

    fn recreate(&self, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
        let count = parts.next_varint()?;
        for i in 0..count as usize {
            if i > 0 {
                out.push(self.delimiter);
            }
            match self.column(i) {
                Column::Verbatim | Column::Cacheable => out.extend_from_slice(parts.next_part()?),
                Column::Split(sep) => {
                    let pieces = parts.next_varint()?;
                    if pieces == 0 {
                        return Err(Error::Malformed("a split column has at least one piece"));
                    }
                    for p in 0..pieces {
                        if p > 0 {
                            out.push(sep);
                        }
                        out.extend_from_slice(parts.next_part()?);
                    }
                }
            }
        }
        Ok(())
    }

    fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(b"csv");
        h.write(&[self.delimiter]);
        for c in &self.columns {
            match c {
                Column::Verbatim => h.write(&[0]),
                Column::Cacheable => h.write(&[1]),
                Column::Split(sep) => h.write(&[2, *sep]),
            }
        }
        h.finish()
    }
}

/// Which literals of a SQL statement are cacheable when no rule names the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlParams {
    None,
    /// String literals (names, codes, categories); numbers stay verbatim.
    Strings,
    All,
}

/// Statements whose template starts with `template_prefix` (ASCII case-insensitive) have the
/// literals at `cacheable` positions (from 0) cacheable, the others verbatim.
#[derive(Debug, Clone)]
pub struct SqlRule {
    pub template_prefix: String,
    pub cacheable: Vec<usize>,
}

/// SQL statements: the template (the statement with each literal replaced by a placeholder) is
/// cacheable, and so are the literals that rules or the default say recur.
#[derive(Debug, Clone)]
pub struct SqlPreprocessor {
    pub rules: Vec<SqlRule>,
    pub default: SqlParams,
}

/// Stands for a literal inside a template; a statement containing it is kept opaque.
const PLACEHOLDER: u8 = 0;
const MODE_OPAQUE: u64 = 0;
const MODE_TEMPLATE: u64 = 1;

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'$'
}

/// Splits a statement into its template and the byte ranges of its literals (quoted strings
/// with '' escapes, and numbers that are not part of an identifier).
fn tokenize(sql: &[u8]) -> (Vec<u8>, Vec<(usize, usize, bool)>) {
    let mut template = Vec::with_capacity(sql.len());
    let mut literals = Vec::new();
    let mut i = 0;
    while i < sql.len() {
        let b = sql[i];
        if b == b'\'' {
            let mut j = i + 1;
            while j < sql.len() {
                if sql[j] == b'\'' {
                    if sql.get(j + 1) == Some(&b'\'') {
                        j += 2;
                        continue;
                    }
                    j += 1;
                    break;
                }
                j += 1;
            }
            let end = j.min(sql.len());
            literals.push((i, end, true));
            template.push(PLACEHOLDER);
            i = end;
        } else if b.is_ascii_digit() && (i == 0 || !is_word_byte(sql[i - 1])) {
            let mut j = i;
            while j < sql.len() && (sql[j].is_ascii_digit() || sql[j] == b'.') {
                j += 1;
            }
            literals.push((i, j, false));
            template.push(PLACEHOLDER);
            i = j;
        } else if b == b'"' {
            // A quoted identifier belongs to the template, quotes and all.
            let mut j = i + 1;
            while j < sql.len() && sql[j] != b'"' {
                j += 1;
            }
            let end = (j + 1).min(sql.len());
            template.extend_from_slice(&sql[i..end]);
            i = end;
        } else {
            template.push(b);
            i += 1;
        }
    }
    (template, literals)
}

impl SqlPreprocessor {
    fn cacheable(&self, template: &[u8], position: usize, is_string: bool) -> bool {
        let rule = self.rules.iter().find(|r| {
            template.len() >= r.template_prefix.len()
                && template[..r.template_prefix.len()].eq_ignore_ascii_case(r.template_prefix.as_bytes())
        });
        match rule {
            Some(rule) => rule.cacheable.contains(&position),
            None => match self.default {
                SqlParams::None => false,
                SqlParams::Strings => is_string,
                SqlParams::All => true,
            },
        }
    }
}

impl Preprocessor for SqlPreprocessor {
    fn preprocess(&self, command: &Bytes, parts: &mut Vec<Part>) {
        if command.contains(&PLACEHOLDER) {
            parts.push(varint_part(MODE_OPAQUE));
            parts.push(Part::Verbatim(command.clone()));
            return;
        }
        let (template, literals) = tokenize(command);
        parts.push(varint_part(MODE_TEMPLATE));
        for (position, (start, end, is_string)) in literals.iter().enumerate() {
            let literal = command.slice(*start..*end);
            // Parts go after the template; remember them in order first.
            parts.push(if self.cacheable(&template, position, *is_string) {
                Part::Cacheable(literal)
            } else {
                Part::Verbatim(literal)
            });
        }
        let first_literal = parts.len() - literals.len();
        parts.insert(first_literal, Part::Cacheable(Bytes::from(template)));
    }

    fn recreate(&self, parts: &mut PartReader<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
        match parts.next_varint()? {
            MODE_OPAQUE => out.extend_from_slice(parts.next_part()?),
            MODE_TEMPLATE => {
                let template = parts.next_part()?;
                let mut rest: &[u8] = template;
                while let Some(at) = rest.iter().position(|b| *b == PLACEHOLDER) {
                    out.extend_from_slice(&rest[..at]);
                    out.extend_from_slice(parts.next_part()?);
                    rest = &rest[at + 1..];
                }
                out.extend_from_slice(rest);
            }
            _ => return Err(Error::Malformed("unknown SQL part mode")),
        }
        Ok(())
    }

    fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(b"sql");
        h.write(&[self.default as u8]);
        for rule in &self.rules {
            h.write(rule.template_prefix.as_bytes());
            h.write(&[0]);
            for c in &rule.cacheable {
                h.write(&(*c as u64).to_le_bytes());
            }
        }
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_command, encode_command, varint, CacheConfig, ItemCache, Policy};

    fn round_trip(p: &dyn Preprocessor, command: &[u8]) -> Vec<Part> {
        let command = Bytes::copy_from_slice(command);
        let mut parts = Vec::new();
        p.preprocess(&command, &mut parts);
        let bytes: Vec<Bytes> = parts.iter().map(|p| p.bytes().clone()).collect();
        let mut out = Vec::new();
        let mut reader = PartReader::new(&bytes);
        p.recreate(&mut reader, &mut out).unwrap();
        assert!(reader.is_done());
        assert_eq!(out, command.as_ref(), "{:?}", String::from_utf8_lossy(&command));
        // And through the encoder with an empty cache.
        let cache = ItemCache::new(CacheConfig {
            policy: Policy::Lru,
            max_items: 16,
            max_bytes: 4096,
        });
        let mut encoded = Vec::new();
        encode_command(&cache, &parts, &mut encoded);
        let mut decoded = Vec::new();
        decode_command(&cache, p, &mut varint::Reader::new(&encoded), &mut decoded).unwrap();
        assert_eq!(decoded, command.as_ref());
        parts
    }

    fn cacheable(parts: &[Part]) -> Vec<String> {
        parts
            .iter()
            .filter_map(|p| match p {
                Part::Cacheable(b) => Some(String::from_utf8_lossy(b).into_owned()),
                Part::Verbatim(_) => None,
            })
            .collect()
    }

    #[test]
    fn sql_template_and_configured_parameters_as_in_the_paper() {
        let p = SqlPreprocessor {
            rules: vec![SqlRule {
                template_prefix: "INSERT INTO members".into(),
                cacheable: vec![0, 1, 2],
            }],
            default: SqlParams::Strings,
        };
        let parts = round_trip(
            &p,
            b"INSERT INTO members VALUES ('John', 'Doe', 'Dentist', '2022-01-01 10:10:17', 1)",
        );
        assert_eq!(
            cacheable(&parts),
            vec![
                "INSERT INTO members VALUES (\0, \0, \0, \0, \0)",
                "'John'",
                "'Doe'",
                "'Dentist'"
            ]
        );
        for sql in [
            "SELECT * FROM t WHERE a = 'it''s' AND b=42 AND c2 = 3.5",
            "UPDATE \"weird 'table'\" SET x = 1",
            "select 'unterminated",
            "",
            "x\0y",
            "INSERT INTO t VALUES (-5, 1e10, 'é')",
        ] {
            round_trip(&p, sql.as_bytes());
        }
    }

    #[test]
    fn csv_columns_and_split_words() {
        let p = CsvPreprocessor::new(b',', &[1, 2], &[(3, b' ')]);
        let parts = round_trip(&p, b"42,alice@example.com,inbox,Re: lunch on friday,2001-05-14");
        assert_eq!(
            cacheable(&parts),
            vec!["alice@example.com", "inbox", "Re:", "lunch", "on", "friday"]
        );
        for record in [
            "1,\"quoted, with comma\",x,\"a \"\"b\"\" c\",z",
            "only",
            "",
            ",,,,",
            "1,\"unterminated,2,3",
            "a,b,c,  double  spaces ,e\r\n",
        ] {
            round_trip(&p, record.as_bytes());
        }
    }

    #[test]
    fn opaque_round_trips_anything() {
        round_trip(&OpaquePreprocessor, b"\x00\xff anything");
        round_trip(&OpaquePreprocessor, b"");
    }
}
