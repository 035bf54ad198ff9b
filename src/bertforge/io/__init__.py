"""Files in and out: reading user files with `file:line` errors (`read.py`), writing every file atomically
(`write.py`) and claiming run output folders (`rundir.py`: lock, overwrite refusal, recorded options, resume
checks). The ground floor: nothing here imports another part of bertforge but its errors."""
