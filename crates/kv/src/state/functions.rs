//! Redis 7's functions: libraries of Lua functions, loaded through the log (FUNCTION LOAD) and
//! called by name (FCALL), kept in the state so that every replica holds the same ones and they
//! survive restarts. A library is one record (its name under `LIBRARY_TAG`: its code, metadata
//! line included) and each of its functions one more (its name under `FUNCTION_TAG`: the
//! library's name), so FCALL finds its library in one lookup. Functions' flags and descriptions
//! are not stored: running the library's code again (as every FCALL does, in a VM of its own)
//! registers them again, alike on every replica.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_resp::Value;

use super::scripts::{is_function_name, library_functions, FunctionInfo, INVALID_NAME};
use super::{KvState, FUNCTION_TAG, LIBRARY_TAG};
use crate::command::{FunctionRead, FunctionWrite, RestorePolicy};
use crate::dump;
use crate::glob::glob_match;

fn tagged(tag: u8, name: &[u8]) -> Bytes {
    let mut key = BytesMut::with_capacity(1 + name.len());
    key.put_u8(tag);
    key.put_slice(name);
    key.freeze()
}

fn library_key(name: &[u8]) -> Bytes {
    tagged(LIBRARY_TAG, name)
}

fn function_key(name: &[u8]) -> Bytes {
    tagged(FUNCTION_TAG, name)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A library that loaded: its name, code and functions.
struct Library {
    name: Bytes,
    code: Bytes,
    functions: Vec<FunctionInfo>,
}

/// A kept library's code after its metadata line, from the line's newline on, so that Lua
/// numbers the code's lines as Redis does (the metadata line is line 1).
pub(super) fn library_body(code: &[u8]) -> &[u8] {
    let newline = code
        .iter()
        .position(|&c| c == b'\n')
        .expect("a kept library has a metadata line");
    &code[newline..]
}

/// The library's name from its metadata line (`#!lua name=<name>`), checked as FUNCTION LOAD
/// checks it: the line's form, the name's characters, then the engine.
fn checked_name(code: &[u8]) -> Result<Bytes, Value> {
    // Redis reads the metadata line as a C string: it ends at a NUL.
    let line = &code[..code.iter().position(|&c| c == 0).unwrap_or(code.len())];
    if !line.starts_with(b"#!") {
        return Err(Value::error("ERR Missing library metadata"));
    }
    let invalid = || Value::error("ERR Invalid library metadata");
    let end = line.iter().position(|&c| c == b'\n').ok_or_else(invalid)?;
    let words = split_args(&line[..end]).filter(|w| !w.is_empty()).ok_or_else(invalid)?;
    let engine = words[0].get(2..).unwrap_or_default();
    let mut name = None;
    for word in &words[1..] {
        match word.get(..5) {
            Some(key) if key.eq_ignore_ascii_case(b"name=") => {
                if name.is_some() {
                    return Err(Value::error(
                        "ERR Invalid metadata value, name argument was given multiple times",
                    ));
                }
                name = Some(Bytes::copy_from_slice(&word[5..]));
            }
            _ => {
                return Err(Value::error(format!(
                    "ERR Invalid metadata value given: {}",
                    text(word)
                )))
            }
        }
    }
    let name = name.ok_or_else(|| Value::error("ERR Library name was not given"))?;
    if !is_function_name(&name) {
        return Err(Value::error(format!("ERR {INVALID_NAME}")));
    }
    if !engine.eq_ignore_ascii_case(b"lua") {
        return Err(Value::error(format!("ERR Engine '{}' not found", text(engine))));
    }
    Ok(name)
}

/// The functions a library's code registers; at least one.
fn checked_functions(code: &[u8]) -> Result<Vec<FunctionInfo>, Value> {
    let functions = library_functions(library_body(code))?;
    if functions.is_empty() {
        return Err(Value::error("ERR No functions registered"));
    }
    Ok(functions)
}

/// The words of a line as Redis's `sdssplitargs` reads them: separated by white space, in
/// double quotes (with `\n`-style and `\xHH` escapes) or in single quotes (with `\'`); `None`
/// for a quote left open or closed against the next word.
fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let is_space = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        while at(i) != 0 && is_space(at(i)) {
            i += 1;
        }
        if at(i) == 0 {
            return Some(words);
        }
        let (mut in_double, mut in_single) = (false, false);
        let mut word = Vec::new();
        loop {
            let c = at(i);
            if in_double {
                match (c, at(i + 1), hex(at(i + 2)), hex(at(i + 3))) {
                    (b'\\', b'x', Some(high), Some(low)) => {
                        word.push(high * 16 + low);
                        i += 3;
                    }
                    (b'\\', escaped, _, _) if escaped != 0 => {
                        i += 1;
                        word.push(match escaped {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                    }
                    (b'"', next, _, _) => {
                        if next != 0 && !is_space(next) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    (0, _, _, _) => return None,
                    _ => word.push(c),
                }
            } else if in_single {
                match (c, at(i + 1)) {
                    (b'\\', b'\'') => {
                        i += 1;
                        word.push(b'\'');
                    }
                    (b'\'', next) => {
                        if next != 0 && !is_space(next) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    (0, _) => return None,
                    _ => word.push(c),
                }
            } else {
                match c {
                    0 => break,
                    b' ' | b'\n' | b'\r' | b'\t' => {
                        i += 1;
                        break;
                    }
                    b'"' => in_double = true,
                    b'\'' => in_single = true,
                    _ => word.push(c),
                }
            }
            i += 1;
        }
        words.push(word);
    }
}

impl KvState {
    /// The code of the library holding function `name`, if there is one.
    pub(super) fn function_library_code(&mut self, name: &[u8]) -> Option<Bytes> {
        let library = self.record(&function_key(name))?;
        Some(
            self.record(&library_key(&library))
                .expect("a function's library is kept with it"),
        )
    }

    fn record(&mut self, key: &[u8]) -> Option<Bytes> {
        self.store.get(key).unwrap_or_else(|e| super::unreadable(e))
    }

    pub(super) fn execute_function_write(&mut self, index: u64, write: FunctionWrite) -> Value {
        match write {
            FunctionWrite::Load { code, replace } => {
                self.load_library(index, code, replace).map_or_else(|e| e, Value::bulk)
            }
            FunctionWrite::Delete(name) => {
                if !self.store.contains(&library_key(&name)) {
                    return Value::error("ERR Library not found");
                }
                self.unlink_library(index, &name);
                Value::ok()
            }
            FunctionWrite::Flush => {
                self.unlink_every_library(index);
                Value::ok()
            }
            FunctionWrite::Restore { libraries, policy } => self
                .restore_libraries(index, &libraries, policy)
                .map_or_else(|e| e, |()| Value::ok()),
        }
    }

    /// FUNCTION LOAD: checked in Redis's order — the metadata, whether the name is taken, the
    /// code, then whether another library has one of its functions.
    fn load_library(&mut self, index: u64, code: Bytes, replace: bool) -> Result<Bytes, Value> {
        let name = checked_name(&code)?;
        let exists = self.store.contains(&library_key(&name));
        if exists && !replace {
            return Err(Value::error(format!("ERR Library '{}' already exists", text(&name))));
        }
        let functions = checked_functions(&code)?;
        for function in &functions {
            if self
                .record(&function_key(&function.name))
                .is_some_and(|owner| owner != name)
            {
                return Err(Value::error(format!(
                    "ERR Function {} already exists",
                    text(&function.name)
                )));
            }
        }
        if exists {
            self.unlink_library(index, &name);
        }
        self.link_library(
            index,
            &Library {
                name: name.clone(),
                code,
                functions,
            },
        );
        Ok(name)
    }

    /// FUNCTION RESTORE: every library in the payload loads, with no name or function twice,
    /// before any is added; with APPEND a name taken refuses them all, with REPLACE it is
    /// replaced; a function of a library that stays refuses them all either way.
    fn restore_libraries(&mut self, index: u64, codes: &[Bytes], policy: RestorePolicy) -> Result<(), Value> {
        let mut incoming: Vec<Library> = Vec::new();
        for code in codes {
            let name = checked_name(code)?;
            if incoming.iter().any(|library| library.name == name) {
                return Err(Value::error(format!("ERR Library '{}' already exists", text(&name))));
            }
            let functions = checked_functions(code)?;
            let known = |f: &FunctionInfo| incoming.iter().flat_map(|l| &l.functions).any(|g| g.name == f.name);
            if let Some(twice) = functions.iter().find(|f| known(f)) {
                return Err(Value::error(format!(
                    "ERR Function {} already exists",
                    text(&twice.name)
                )));
            }
            incoming.push(Library {
                name,
                code: code.clone(),
                functions,
            });
        }
        if policy == RestorePolicy::Flush {
            self.unlink_every_library(index);
        } else {
            let replaced: Vec<Bytes> = incoming
                .iter()
                .filter(|library| self.store.contains(&library_key(&library.name)))
                .map(|library| library.name.clone())
                .collect();
            if let (Some(taken), RestorePolicy::Append) = (replaced.first(), policy) {
                return Err(Value::error(format!("ERR Library {} already exists", text(taken))));
            }
            for function in incoming.iter().flat_map(|library| &library.functions) {
                if self
                    .record(&function_key(&function.name))
                    .is_some_and(|owner| !replaced.contains(&owner))
                {
                    return Err(Value::error(format!(
                        "ERR Function {} already exists",
                        text(&function.name)
                    )));
                }
            }
            for name in &replaced {
                self.unlink_library(index, name);
            }
        }
        for library in &incoming {
            self.link_library(index, library);
        }
        Ok(())
    }

    fn link_library(&mut self, index: u64, library: &Library) {
        self.store
            .write(index, library_key(&library.name), Some(library.code.clone()));
        for function in &library.functions {
            self.store
                .write(index, function_key(&function.name), Some(library.name.clone()));
        }
    }

    fn unlink_library(&mut self, index: u64, name: &[u8]) {
        self.store.write(index, library_key(name), None);
        for key in self.store.group_keys(&[FUNCTION_TAG]) {
            if self.record(&key).is_some_and(|library| library == name) {
                self.store.write(index, key, None);
            }
        }
    }

    fn unlink_every_library(&mut self, index: u64) {
        for tag in [LIBRARY_TAG, FUNCTION_TAG] {
            for key in self.store.group_keys(&[tag]) {
                self.store.write(index, key, None);
            }
        }
    }

    /// The libraries' names and code, in name order.
    fn libraries(&mut self) -> Vec<(Bytes, Bytes)> {
        self.store
            .group_keys(&[LIBRARY_TAG])
            .into_iter()
            .map(|key| {
                let code = self.record(&key).expect("a listed library has code");
                (key.slice(1..), code)
            })
            .collect()
    }

    pub(super) fn read_functions(&mut self, read: &FunctionRead) -> Value {
        match read {
            FunctionRead::List { pattern, with_code } => {
                let mut listed = Vec::new();
                for (name, code) in self.libraries() {
                    if pattern.as_ref().is_some_and(|p| !glob_match(p, &name, true)) {
                        continue;
                    }
                    // A kept library registered its functions when it was loaded, and running
                    // the same code again registers the same ones.
                    let functions = library_functions(library_body(&code)).unwrap_or_default();
                    let functions = functions.iter().map(|f| {
                        Value::Map(vec![
                            (Value::bulk("name"), Value::bulk(f.name.clone())),
                            (
                                Value::bulk("description"),
                                f.description.clone().map_or_else(Value::null, Value::bulk),
                            ),
                            (
                                Value::bulk("flags"),
                                Value::array(f.flag_names().map(|flag| Value::Simple(flag.into())).collect()),
                            ),
                        ])
                    });
                    let mut library = vec![
                        (Value::bulk("library_name"), Value::bulk(name)),
                        (Value::bulk("engine"), Value::bulk("LUA")),
                        (Value::bulk("functions"), Value::array(functions.collect())),
                    ];
                    if *with_code {
                        library.push((Value::bulk("library_code"), Value::bulk(code)));
                    }
                    listed.push(Value::Map(library));
                }
                Value::array(listed)
            }
            FunctionRead::Stats => {
                let count = |state: &mut KvState, tag: u8| Value::Integer(state.store.group_len(&[tag]) as i64);
                let engine = Value::Map(vec![
                    (Value::bulk("libraries_count"), count(self, LIBRARY_TAG)),
                    (Value::bulk("functions_count"), count(self, FUNCTION_TAG)),
                ]);
                Value::Map(vec![
                    // Nothing runs while a read is answered: entries apply one at a time.
                    (Value::bulk("running_script"), Value::null()),
                    (Value::bulk("engines"), Value::Map(vec![(Value::bulk("LUA"), engine)])),
                ])
            }
            FunctionRead::Dump => {
                let codes: Vec<Bytes> = self.libraries().into_iter().map(|(_, code)| code).collect();
                Value::bulk(Bytes::from(dump::encode_libraries(&codes)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Option<Vec<String>> {
        split_args(line.as_bytes()).map(|w| w.iter().map(|w| text(w)).collect())
    }

    #[test]
    fn a_metadata_line_splits_as_redis_splits_arguments() {
        assert_eq!(words("#!lua name=x").unwrap(), ["#!lua", "name=x"]);
        assert_eq!(words("  #!lua \t name=\"a b\"  ").unwrap(), ["#!lua", "name=a b"]);
        assert_eq!(words(r#"#!lua name="\x41\n""#).unwrap(), ["#!lua", "name=A\n"]);
        assert_eq!(words(r"#!lua 'it\'s'").unwrap(), ["#!lua", "it's"]);
        assert_eq!(words("#!lua name=\"open"), None);
        assert_eq!(words("#!lua \"closed\"against"), None);
        assert_eq!(words("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn metadata_is_checked_in_redis_s_order() {
        let error = |code: &str| match checked_name(code.as_bytes()) {
            Err(Value::Error(e)) => e,
            other => panic!("{code:?} gave {other:?}"),
        };
        assert_eq!(checked_name(b"#!LUA NAME=lib_1\nreturn").unwrap(), "lib_1");
        assert_eq!(error("return 1"), "ERR Missing library metadata");
        assert_eq!(error("#!lua name=x"), "ERR Invalid library metadata");
        assert_eq!(error("#!lua name=x\0\n"), "ERR Invalid library metadata");
        assert_eq!(
            error("#!lua name=x foo=bar\n"),
            "ERR Invalid metadata value given: foo=bar"
        );
        assert_eq!(
            error("#!lua name=x name=y\n"),
            "ERR Invalid metadata value, name argument was given multiple times"
        );
        assert_eq!(error("#!lua\n"), "ERR Library name was not given");
        assert_eq!(error("#!js name=a-b\n"), format!("ERR {INVALID_NAME}"));
        assert_eq!(error("#!js name=ab\n"), "ERR Engine 'js' not found");
    }
}
