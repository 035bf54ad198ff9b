"""Files in and out: reading user files with `file:line` errors (`read.py`), every data source as rows of named
columns (`tables.py`: files of any format, saved and Hub datasets, data in memory), writing every file atomically
(`write.py`) and claiming run output folders (`rundir.py`: lock, overwrite refusal, recorded options, resume
checks). The ground floor: nothing here imports another part of bertforge but its errors."""
