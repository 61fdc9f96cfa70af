# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake: the bytes of IN
# as a C array NAME (NUL-terminated), so that a program carries the file.
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Made by cmake/embed.cmake from ${IN}; do not edit. */\nconst char ${NAME}[] = {\n${body}0x00};\n")
