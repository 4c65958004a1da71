//! Loading a compiled model into this process: its object and the runtime are linked into a shared
//! library by the system C compiler (`cc -shared`), which is opened with libloading; `run` calls the
//! model's entry point on caller buffers of the sizes the program declares.

#![allow(unsafe_code)] // dlopen and the call through the model's C ABI; see the SAFETY notes.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("linking the compiled model with `cc -shared` failed: {0}")]
    Link(String),
    #[error("loading the compiled model: {0}")]
    Load(String),
    #[error("{0}")]
    Args(String),
    /// The compiled code's status and message (`mlopt_<name>_run`, `mlopt_<name>_error`).
    #[error("{message} (status {status})")]
    Run { status: i32, message: String },
}

type RunFn = unsafe extern "C" fn(*mut u8, *const *const u8, *const *mut u8) -> i32;
type ErrorFn = unsafe extern "C" fn(*const u8) -> *const std::ffi::c_char;
type CreateFn = unsafe extern "C" fn() -> *mut u8;
type DestroyFn = unsafe extern "C" fn(*mut u8);

/// A compiled model loaded into this process.
#[derive(Debug)]
pub struct Loaded {
    /// Kept so the library is never unloaded before `entry` (it is linked `nodelete` anyway).
    _lib: libloading::Library,
    /// The model's entry point, its error message and its context's destructor, looked up once.
    entry: libloading::os::unix::Symbol<RunFn>,
    error: libloading::os::unix::Symbol<ErrorFn>,
    destroy: libloading::os::unix::Symbol<DestroyFn>,
    /// The run's context, made by the library's `mlopt_<name>_create` as a C caller's is.
    context: *mut u8,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    _dir: tempfile::TempDir,
}

impl Loaded {
    /// Links `objects` (which define `mlopt_<name>_create`, `_run`, `_error` and `_destroy`, `name`
    /// being the program's C name) with the runtime, loads them and creates a context. `inputs`/`outputs`
    /// are the byte sizes of the model's buffers.
    pub fn new(
        objects: &[crate::Member],
        name: &str,
        inputs: Vec<usize>,
        outputs: Vec<usize>,
    ) -> Result<Loaded, RuntimeError> {
        let dir = tempfile::tempdir().map_err(|e| RuntimeError::Link(e.to_string()))?;
        let (rt, so) = (dir.path().join("runtime.o"), dir.path().join("model.so"));
        let write = |p: &Path, parts: &[&[u8]]| {
            let failed = |e: std::io::Error| RuntimeError::Link(format!("{}: {e}", p.display()));
            let mut f = std::fs::File::create(p).map_err(failed)?;
            parts
                .iter()
                .try_for_each(|b| std::io::Write::write_all(&mut f, b))
                .map_err(failed)
        };
        let mut models = Vec::with_capacity(objects.len());
        for (i, object) in objects.iter().enumerate() {
            let path = dir.path().join(format!("model{i}.o"));
            write(&path, &object.parts)?;
            models.push(path);
        }
        write(&rt, &[crate::RUNTIME_OBJECT])?;
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            // nodelete: the runtime's worker threads live in this library's code, so it must stay mapped
            // after the handle is dropped.
            .args(["-shared", "-Wl,-z,nodelete", "-o"])
            .arg(&so)
            .args(&models)
            .arg(&rt)
            .args(["-lm", "-lpthread"])
            .output()
            .map_err(|e| {
                RuntimeError::Link(format!(
                    "{cc}: {e} (a C compiler is needed to load compiled code in-process)"
                ))
            })?;
        if !out.status.success() {
            return Err(RuntimeError::Link(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        // SAFETY: the library is mlopt's own output plus its runtime; their initialisers do nothing.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| RuntimeError::Load(e.to_string()))?;
        // SAFETY: the symbols are the generated `void *create(void)`, `int run(void*, const void* const*,
        // void* const*)`, `const char *error(const void*)` and `void destroy(void*)`; raw symbols stay
        // valid while `lib` is loaded, which `Loaded` guarantees by owning it.
        let symbol = |what: &str| format!("mlopt_{name}_{what}").into_bytes();
        let load = |e: libloading::Error| RuntimeError::Load(e.to_string());
        let (entry, error, create, destroy) = unsafe {
            (
                lib.get::<RunFn>(&symbol("run")).map_err(load)?.into_raw(),
                lib.get::<ErrorFn>(&symbol("error"))
                    .map_err(load)?
                    .into_raw(),
                lib.get::<CreateFn>(&symbol("create"))
                    .map_err(load)?
                    .into_raw(),
                lib.get::<DestroyFn>(&symbol("destroy"))
                    .map_err(load)?
                    .into_raw(),
            )
        };
        // SAFETY: create has no preconditions; NULL means out of memory.
        let context = unsafe { create() };
        if context.is_null() {
            return Err(RuntimeError::Load(
                "out of memory for the model's context".into(),
            ));
        }
        Ok(Loaded {
            _lib: lib,
            entry,
            error,
            destroy,
            context,
            inputs,
            outputs,
            _dir: dir,
        })
    }

    /// The exported `uint64_t symbol[len]` of the loaded code (a profiled build's counters), to read and
    /// reset between runs.
    pub fn counters(&mut self, symbol: &str, len: usize) -> Result<&mut [u64], RuntimeError> {
        // SAFETY: the symbol is a data object the generated module defines as `[len x i64]`, 64-byte
        // aligned; `&mut self` keeps runs (the only other writer) from overlapping the borrow.
        unsafe {
            let p = self
                ._lib
                .get::<*mut u64>(symbol.as_bytes())
                .map_err(|e| RuntimeError::Load(e.to_string()))?;
            let p: *mut u64 = *p;
            Ok(std::slice::from_raw_parts_mut(p, len))
        }
    }

    /// Runs the model: `inputs[i]` and `outputs[i]` must have exactly the declared byte sizes.
    pub fn run(&mut self, inputs: &[&[u8]], outputs: &mut [Vec<u8>]) -> Result<(), RuntimeError> {
        let sizes = |what: &str, got: Vec<usize>, want: &[usize]| {
            if got != want {
                Err(RuntimeError::Args(format!(
                    "{what}: buffers of {got:?} bytes, the model takes {want:?}"
                )))
            } else {
                Ok(())
            }
        };
        sizes(
            "inputs",
            inputs.iter().map(|b| b.len()).collect(),
            &self.inputs,
        )?;
        sizes(
            "outputs",
            outputs.iter().map(|b| b.len()).collect(),
            &self.outputs,
        )?;
        let ins: Vec<*const u8> = inputs.iter().map(|b| b.as_ptr()).collect();
        let outs: Vec<*mut u8> = outputs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        let ctx = self.context;
        let f = &self.entry;
        // SAFETY: every pointer is valid for the size the program declares (checked above; the context
        // is the library's own), and the generated code stays inside them (verified kernels).
        let status = unsafe { f(ctx, ins.as_ptr(), outs.as_ptr()) };
        if status == 0 {
            return Ok(());
        }
        let e = &self.error;
        // SAFETY: error() returns a pointer to a NUL-terminated constant string of the library.
        let message = unsafe { std::ffi::CStr::from_ptr(e(ctx)) }
            .to_string_lossy()
            .into_owned();
        Err(RuntimeError::Run { status, message })
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: the context came from the library's create and is destroyed once, here.
        unsafe { (self.destroy)(self.context) }
    }
}
