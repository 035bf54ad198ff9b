"""Files in and out: reading user files with `file:line` errors (`read.py`), every data source as rows of named
columns (`tables.py`, opening `files.py`: files of any format, compressed too; `hubdata.py`: saved and Hub
datasets; `memory.py`: data in memory; all as `rows.py`'s Table and Row), model names as folders or Hub ids
(`hub.py`), writing every file atomically (`write.py`) and claiming run output folders (`rundir.py`: lock,
overwrite refusal, recorded options, resume checks). The ground floor: nothing here imports another part of
bertforge but its errors."""
