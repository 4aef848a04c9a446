from tpubuild.cli import main

main()
